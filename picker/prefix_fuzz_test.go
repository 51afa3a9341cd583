package picker

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fastjson"

	"github.com/infergate/infergate/openai"
)

// Prefix hashing runs over every accepted body's prompt: it never panics, stays within MaxBlocks, and gives
// the same hashes for the same prompt.
func FuzzPrefixHash(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"system","content":"rules"},{"role":"user","content":[{"type":"text","text":"hi"}],"tool_calls":[{"id":"1"}]}]}`, uint8(1), uint16(64))
	f.Add(`{"model":"m","prompt":["a","b",[1,2,3]]}`, uint8(2), uint16(1))
	f.Add(`{"model":"m","input":"\u0000\ud800 é"}`, uint8(3), uint16(0))
	f.Fuzz(func(t *testing.T, body string, ep uint8, blockBytes uint16) {
		req, err := openai.ParseRequest(openai.Endpoint(ep%3+1), []byte(body))
		if err != nil {
			return
		}
		defer req.Release()
		h := Hasher{BlockBytes: int(blockBytes), MaxBlocks: 64}
		a := h.Hash(nil, Seed(req.Model, ""), req.Prompt)
		b := h.Hash(nil, Seed(req.Model, ""), req.Prompt)
		if len(a) > 64 {
			t.Fatalf("%d blocks, limit 64", len(a))
		}
		if !slices.Equal(a, b) {
			t.Fatal("hashing the same prompt twice differs")
		}
		// Read in place, the prompt hashes as it did parsed into a tree and re-marshalled (which decodes
		// object keys, so only bodies without escapes compare).
		if !strings.Contains(body, "\\") {
			if want := treeHash(t, h, Seed(req.Model, ""), req.Prompt); !slices.Equal(a, want) {
				t.Fatalf("hashes %x, parsed into a tree %x", a, want)
			}
		}
	})
}

// treeHash hashes a prompt as the hasher did when requests were parsed into a fastjson tree: each value
// re-marshalled compact.
func treeHash(t *testing.T, h Hasher, seed uint64, prompt []byte) []uint64 {
	v, err := fastjson.ParseBytes(prompt)
	if err != nil {
		t.Fatal(err)
	}
	w := blockWriter{size: min(cmp.Or(h.BlockBytes, DefaultBlockTokens*CharsPerToken), maxBlockBytes),
		max: cmp.Or(h.MaxBlocks, 256), prev: seed}
	raw := func(v *fastjson.Value) {
		if v != nil {
			w.write(v.MarshalTo(nil))
		}
	}
	if v.Type() != fastjson.TypeArray {
		raw(v)
		return w.hashes
	}
	for _, item := range v.GetArray() {
		if w.full() {
			break
		}
		if item.Type() == fastjson.TypeObject && item.Exists("role") {
			raw(item.Get("role"))
			w.write(sepRole)
			raw(item.Get("content"))
			raw(item.Get("tool_calls"))
		} else {
			raw(item)
		}
		w.write(sepMessage)
	}
	return w.hashes
}

// A Responses API prompt hashes as the chat prompt it stands for: instructions as the system message, then the
// input's messages, so the two APIs share a replica's cached prefix.
func TestInstructionsHashAsTheSystemMessage(t *testing.T) {
	parse := func(s string) []byte { return []byte(s) }
	h := Hasher{BlockBytes: 16, MaxBlocks: 64}
	chat := h.Hash(nil, 1, parse(`[{"role":"system","content":"You are a careful assistant."},{"role":"user","content":"hello there"}]`))
	responses := h.HashWithInstructions(nil, 1, parse(`"You are a careful assistant."`), parse(`[{"role":"user","content":"hello there"}]`))
	if len(chat) == 0 || !slices.Equal(chat, responses) {
		t.Errorf("chat %x, responses %x", chat, responses)
	}
}
