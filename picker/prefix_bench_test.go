package picker

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/openai"
)

// BenchmarkHashChatPrompt is the block hashing of a chat prompt on the request path, at the sizes the decision
// benchmarks use: a system message of 2 or 32 KiB and a short question. Hashing reads each message's role,
// content and tool calls in one walk and writes a string content whole; a regression to a walk per member shows
// here.
//
//	go test ./picker -run '^$' -bench HashChatPrompt -benchmem
func BenchmarkHashChatPrompt(b *testing.B) {
	line := `You are a careful assistant. Answer the question below using only the \"context\" given.\n`
	for _, size := range []struct {
		name  string
		lines int
	}{{"2KiB", 23}, {"32KiB", 370}} {
		body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat(line, size.lines) +
			`"},{"role":"user","content":"What does the context say?"}]}`)
		req, err := openai.ParseRequest(openai.EndpointChat, body)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(size.name, func(b *testing.B) {
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
