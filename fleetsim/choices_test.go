package fleetsim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A request for n completions (and, on completions, best_of) is n (best_of) sequences, as vLLM runs it: every
// returned choice in the answer, and every generated sequence's output in its usage — what quota tests charge.
func TestChoicesAreSequencesOfTheirOwn(t *testing.T) {
	r := startReplica(t, ReplicaConfig{Name: "r", Model: "m", Hardware: "l40s"}, 0.01)
	base := "http://" + r.Addr()
	tests := []struct {
		name, path, body string
		choices          int
		completion       int
	}{
		{"chat, n", "/v1/chat/completions", `{"model":"m","n":3,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, 3, 12},
		{"completions, best_of", "/v1/completions", `{"model":"m","n":2,"best_of":5,"max_tokens":4,"prompt":"once upon a time"}`, 2, 20},
		{"chat stream, n", "/v1/chat/completions", `{"model":"m","n":2,"max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, 2, 8},
		{"embeddings ignore n", "/v1/embeddings", `{"model":"m","n":3,"input":"embed me"}`, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(base+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			var u usage
			indexes := map[int]bool{}
			read := func(b []byte) {
				var doc struct {
					Choices []struct {
						Index int `json:"index"`
					} `json:"choices"`
					Usage *usage `json:"usage"`
				}
				if err := json.Unmarshal(b, &doc); err != nil {
					t.Fatalf("bad JSON %q: %v", b, err)
				}
				for _, c := range doc.Choices {
					indexes[c.Index] = true
				}
				if doc.Usage != nil {
					u = *doc.Usage
				}
			}
			if strings.Contains(tc.body, `"stream":true`) {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if line := sc.Text(); strings.HasPrefix(line, "data: {") {
						read([]byte(line[6:]))
					}
				}
			} else {
				var raw json.RawMessage
				if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
					t.Fatal(err)
				}
				read(raw)
			}
			if tc.choices > 0 && len(indexes) != tc.choices {
				t.Errorf("choices %v, want indexes 0..%d", indexes, tc.choices-1)
			}
			if u.CompletionTokens != tc.completion || u.PromptTokens == 0 {
				t.Errorf("usage %+v, want %d completion tokens", u, tc.completion)
			}
		})
	}
}
