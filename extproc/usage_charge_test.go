package extproc

import (
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// A response that reports no usage is charged what it delivered where the gateway saw it, and the reservation
// where it did not (docs/architecture.md, Settlement): never nothing for output it cannot count.
func TestUnreportedUsageChargesWhatWasDelivered(t *testing.T) {
	const text = "Paris is the capital of France, on the Seine." // 45 bytes: 12 tokens at four bytes a token
	tests := []struct {
		name     string
		stream   bool
		respMode filterv3.ProcessingMode_BodySendMode
		body     []string // the response body's chunks; none: response headers end it
		want     int64
	}{
		{"JSON body without usage: its text at four bytes a token", false, modeBuffered,
			[]string{`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + text + `"}}]}`}, 12},
		{"stream without usage: its events with content", true, modeStreamed,
			[]string{"data: {\"choices\":[{\"delta\":{\"content\":\"Pa\"}}]}\n\n", "data: {\"choices\":[{\"delta\":{\"content\":\"ris\"}}]}\n\ndata: [DONE]\n\n"}, 2},
		{"body not seen (mode NONE): the output bound reserved", true, modeNone, nil, 37},
		{"JSON body not seen: the output bound reserved", false, modeNone, nil, 37},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			s := h.open(t, modeBuffered, tc.respMode)
			req := `{"model":"qwen2.5-7b","max_tokens":37,"messages":[{"role":"user","content":"What is the capital of France?"}]}`
			if tc.stream {
				req = `{"model":"qwen2.5-7b","stream":true,"max_tokens":37,"messages":[{"role":"user","content":"What is the capital of France?"}]}`
			}
			s.send(postHeaders("/v1/chat/completions", keyAcme))
			s.recv()
			s.send(reqBody([]byte(req), true))
			s.recv()
			s.send(respHeaders("200", false))
			s.recv()
			for i, chunk := range tc.body {
				s.send(respBody([]byte(chunk), i == len(tc.body)-1))
				s.recv()
			}
			st := h.settlement()
			if st.Reported || st.Usage.CompletionTokens != tc.want || st.Usage.PromptTokens == 0 {
				t.Errorf("settled %+v (reported %v), want %d output tokens charged", st.Usage, st.Reported, tc.want)
			}
		})
	}
}
