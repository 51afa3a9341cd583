package shadow

import (
	"bytes"
	"github.com/infergate/infergate/director"
	"testing"
	"time"
)

// FuzzReadAnswer feeds the candidate's answer readers arbitrary bytes: they must not panic, and the usage they
// report is never negative, whatever numbers the body holds.
func FuzzReadAnswer(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	f.Add([]byte("data: {\"usage\":{\"completion_tokens\":-5}}\n"))
	f.Add([]byte("data:" + string(bytes.Repeat([]byte("["), 1<<16))))
	now := func() time.Time { return time.Unix(1, 0) }
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, read := range []func(a *answer) error{
			func(a *answer) error { return a.readStream(bytes.NewReader(b), now) },
			func(a *answer) error { return a.readJSON(bytes.NewReader(b)) },
		} {
			a := answer{keep: true}
			_ = read(&a)
			if a.usage.PromptTokens < 0 || a.usage.CompletionTokens < 0 {
				t.Fatalf("negative usage %+v from %q", a.usage, b)
			}
			if len(a.text) > director.MaxPairedAnswer {
				t.Fatalf("kept %d bytes of text", len(a.text))
			}
		}
	})
}
