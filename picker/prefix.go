package picker

import (
	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/openai"
)

// Prefix hashing: the prompt is rendered canonically (role and content of each message in order, as the JSON
// the client sent — multi-part content with its image URLs, and tool calls, included; for completions and
// embeddings the prompt or input), cut into blocks of
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

// Seed is the chain's starting value for a model and optional LoRA adapter: the same text under different
// models never shares cache.
func Seed(model, adapter string) uint64 {
	return xxh3.HashString(model + "\x00" + adapter)
}

// Hash appends the block hashes of a prompt (messages, prompt or input, as the body holds it) to dst and
// returns it. Only full blocks are hashed, as engines cache only full blocks.
func (h Hasher) Hash(dst []uint64, seed uint64, prompt []byte) []uint64 {
	return h.HashWithInstructions(dst, seed, nil, prompt)
}

// HashWithInstructions hashes a Responses API prompt: its instructions first, as the system message they
// stand for (the engine puts them there), then the input.
func (h Hasher) HashWithInstructions(dst []uint64, seed uint64, instructions, prompt []byte) []uint64 {
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
	if instructions != nil {
		w.write(roleSystem)
		w.write(sepRole)
		openai.Compact(instructions, w.write)
		w.write(sepMessage)
	}
	render(&w, prompt)
	return w.hashes
}

// messageParts are the members of a chat message that render, in the order they render.
var messageParts = [...]string{"role", "content", "tool_calls"}

var (
	roleSystem = []byte(`"system"`) // as a message's role renders
	sepRole    = []byte{0x1e}       // record separator between role and content
	sepMessage = []byte{0x1f}       // unit separator after each message
)

// render writes the canonical form of a prompt value, each value compact and its strings as the client
// escaped them: for chat, each message's role and content (text parts, image URLs and tool calls included) in
// order; for completions and embeddings, the prompt or input.
func render(w *blockWriter, v []byte) {
	if len(v) == 0 {
		return
	}
	if v[0] != '[' {
		openai.Compact(v, w.write)
		return
	}
	for c := openai.Elements(v); !w.full(); {
		// One walk over the message for its three members: a long content is scanned once, not once to find
		// the message's end and again per member looked up.
		var parts [len(messageParts)][]byte
		item, isObject, ok := c.NextObject(messageParts[:], parts[:])
		if !ok {
			return
		}
		if isObject && parts[0] != nil {
			openai.Compact(parts[0], w.write)
			w.write(sepRole)
			openai.Compact(parts[1], w.write)
			openai.Compact(parts[2], w.write)
		} else {
			openai.Compact(item, w.write)
		}
		w.write(sepMessage)
	}
}
