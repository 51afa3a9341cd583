package openai

import (
	"strings"
	"testing"
)

// BenchmarkParseRequest is the request path's parse of a body, accepted and refused: go test ./openai -run '^$'
// -bench ParseRequest -benchmem
func BenchmarkParseRequest(b *testing.B) {
	line := `You are a careful assistant. Answer the question below using only the \"context\" given.\n`
	for _, bc := range []struct {
		name string
		ep   Endpoint
		body string
	}{
		{"chat-small", EndpointChat,
			`{"model":"llama-70b","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"user":"u1","messages":[{"role":"user","content":"hi"}]}`},
		{"chat-large", EndpointChat,
			`{"model":"m","max_completion_tokens":512,"messages":[{"role":"system","content":"` + strings.Repeat(line, 400) + `"},{"role":"user","content":"q"}]}`},
		{"responses", EndpointResponses,
			`{"model":"m","instructions":"be brief","input":"hello","max_output_tokens":64,"stream":false}`},
		{"refused-repeat", EndpointChat,
			`{"model":"m","model":"n","messages":[{"role":"user","content":"hi"}]}`},
	} {
		body := []byte(bc.body)
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				r, _ := ParseRequest(bc.ep, body)
				r.Release()
			}
		})
	}
}
