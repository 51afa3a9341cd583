package picker

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/openai"
)

// BenchmarkHashChatPrompt is the block hashing of a chat prompt on the request path: a system message of 2 or
// 32 KiB, of text with the escapes JSON-encoded prose has (quotes, newlines) or of plain letters as the decision
// benchmarks send, and a short question. Hashing reads each message's role, content and tool calls in one walk
// and writes a string content whole; a regression to a walk per member shows here.
//
//	go test ./picker -run '^$' -bench HashChatPrompt -benchmem
func BenchmarkHashChatPrompt(b *testing.B) {
	escaped := `You are a careful assistant. Answer the question below using only the \"context\" given.\n`
	plain := strings.Repeat("x", len(escaped))
	for _, bc := range []struct {
		name, line string
		lines      int
	}{{"2KiB/escaped", escaped, 23}, {"2KiB/plain", plain, 23}, {"32KiB/escaped", escaped, 370}, {"32KiB/plain", plain, 370}} {
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat(bc.line, bc.lines) +
			`"},{"role":"user","content":"What does the context say?"}]}`)
		req, err := openai.ParseRequest(openai.EndpointChat, body)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(bc.name, func(b *testing.B) {
			var h Hasher
			dst := make([]uint64, 0, 256)
			b.SetBytes(int64(len(req.Prompt)))
			b.ReportAllocs()
			for b.Loop() {
				if dst = h.Hash(dst[:0], 1, req.Prompt); len(dst) == 0 {
					b.Fatal("no block hashed")
				}
			}
		})
	}
}
