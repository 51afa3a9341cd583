package picker

import (
	"github.com/valyala/fastjson"
	"github.com/zeebo/xxh3"
)

// Prefix hashing: the prompt is rendered canonically (role and content of each message in order; text parts
// and image URLs of multi-part content; for completions and embeddings the prompt text), cut into blocks of
// a fixed number of bytes, and each block hashed with xxh3 seeded by the previous block's hash, the first by
// the model (and LoRA adapter). Equal prompt prefixes give equal leading hashes, whatever follows, which is
// what a replica's prefix KV cache keys on.

// CharsPerToken approximates tokenisation: block bytes = engine block size (tokens) × CharsPerToken.
const CharsPerToken = 4

// DefaultBlockTokens is vLLM's default KV block size.
const DefaultBlockTokens = 16

// maxBlockBytes bounds a block so the hasher's buffer lives on the stack.
const maxBlockBytes = 1024

// Hasher cuts a rendered prompt into chained block hashes. It allocates nothing per block.
type Hasher struct {
	BlockBytes int // block length in bytes (block tokens × CharsPerToken), at most 1024
	MaxBlocks  int // stop after this many blocks, so a 100K-token prompt stays cheap
}

// blockWriter accumulates bytes into blocks and appends one hash per full block.
type blockWriter struct {
	buf    [maxBlockBytes]byte
	n      int
	size   int
	max    int
	prev   uint64
	hashes []uint64
}

func (w *blockWriter) full() bool { return len(w.hashes) >= w.max }

func (w *blockWriter) write(b []byte) {
	for len(b) > 0 && !w.full() {
		k := copy(w.buf[w.n:w.size], b)
		w.n += k
		b = b[k:]
		if w.n == w.size {
			w.prev = xxh3.HashSeed(w.buf[:w.size], w.prev)
			w.hashes = append(w.hashes, w.prev)
			w.n = 0
		}
	}
}

func (w *blockWriter) writeString(s string) {
	for len(s) > 0 && !w.full() {
		k := copy(w.buf[w.n:w.size], s)
		w.n += k
		s = s[k:]
		if w.n == w.size {
			w.prev = xxh3.HashSeed(w.buf[:w.size], w.prev)
			w.hashes = append(w.hashes, w.prev)
			w.n = 0
		}
	}
}

// Seed is the chain's starting value for a model and optional LoRA adapter: the same text under different
// models never shares cache.
func Seed(model, adapter string) uint64 {
	return xxh3.HashString(model + "\x00" + adapter)
}

// Hash appends the block hashes of a parsed prompt (messages, prompt or input) to dst and returns it. Only
// full blocks are hashed, as engines cache only full blocks.
func (h Hasher) Hash(dst []uint64, seed uint64, prompt *fastjson.Value) []uint64 {
	size := h.BlockBytes
	if size <= 0 {
		size = DefaultBlockTokens * CharsPerToken
	}
	size = min(size, maxBlockBytes)
	limit := h.MaxBlocks
	if limit <= 0 {
		limit = 256
	}
	w := blockWriter{size: size, max: limit, prev: seed, hashes: dst}
	render(&w, prompt)
	return w.hashes
}

var (
	sepRole    = []byte{0x1e} // record separator between role and content
	sepMessage = []byte{0x1f} // unit separator after each message
)

// render writes the canonical form of a prompt value.
func render(w *blockWriter, v *fastjson.Value) {
	if v == nil {
		return
	}
	switch v.Type() {
	case fastjson.TypeString:
		w.write(v.GetStringBytes())
	case fastjson.TypeArray:
		for _, item := range v.GetArray() {
			if w.full() {
				return
			}
			if item.Type() == fastjson.TypeObject && item.Exists("role") {
				renderMessage(w, item)
			} else {
				render(w, item)
				w.write(sepMessage)
			}
		}
	}
}

func renderMessage(w *blockWriter, m *fastjson.Value) {
	w.write(m.GetStringBytes("role"))
	w.write(sepRole)
	content := m.Get("content")
	switch {
	case content == nil:
	case content.Type() == fastjson.TypeString:
		w.write(content.GetStringBytes())
	case content.Type() == fastjson.TypeArray:
		for _, part := range content.GetArray() {
			switch string(part.GetStringBytes("type")) {
			case "text":
				w.write(part.GetStringBytes("text"))
			case "image_url":
				w.writeString("<image:")
				w.write(part.GetStringBytes("image_url", "url"))
				w.writeString(">")
			}
		}
	}
	// Tool calls are part of the conversation the engine has seen.
	if calls := m.Get("tool_calls"); calls != nil {
		w.write(calls.MarshalTo(nil))
	}
	w.write(sepMessage)
}
