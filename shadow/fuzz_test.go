package shadow

import (
	"bytes"
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
		for _, read := range []func() (answer, error){
			func() (answer, error) { return readStream(bytes.NewReader(b), now) },
			func() (answer, error) { return readJSON(bytes.NewReader(b), now) },
		} {
			a, _ := read()
			if a.usage.PromptTokens < 0 || a.usage.CompletionTokens < 0 {
				t.Fatalf("negative usage %+v from %q", a.usage, b)
			}
		}
	})
}
