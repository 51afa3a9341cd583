package fleetsim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A decode replica's sidecar runs a request naming a prefiller as llm-d's does: the prefiller serves one prefill
// leg and answers where to pull the KV cache from; the decoder pulls it (its own prefill then a cache hit) and
// streams the answer. A prefiller that cannot answer fails the request with its status, as llm-d's sidecar
// relays it; a request without the header runs whole on the decoder.
func TestSidecarPrefillsRemotely(t *testing.T) {
	prefiller := startReplica(t, ReplicaConfig{Name: "p", Model: "m", Hardware: "h200"}, 0.05)
	decoder := startReplica(t, ReplicaConfig{Name: "d", Model: "m", Hardware: "l40s", Sidecar: true, KVBytesPerToken: 163840}, 0.05)
	long := strings.Repeat("A clause of the contract the model must read. ", 300)
	send := func(prefill string) (int, usage, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true},
			"messages": []map[string]string{{"role": "user", "content": long}}})
		req, _ := http.NewRequest(http.MethodPost, "http://"+decoder.Addr()+"/v1/chat/completions", strings.NewReader(string(body)))
		if prefill != "" {
			req.Header.Set("x-prefiller-host-port", prefill)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var u usage
		for _, line := range strings.Split(string(b), "\n") {
			var chunk struct{ Usage *usage }
			if rest, ok := strings.CutPrefix(line, "data: "); ok && json.Unmarshal([]byte(rest), &chunk) == nil && chunk.Usage != nil {
				u = *chunk.Usage
			}
		}
		return resp.StatusCode, u, string(b)
	}
	status, u, body := send(prefiller.Addr())
	if status != http.StatusOK || prefiller.PrefillLegs() != 1 || decoder.RemotePrefills() != 1 {
		t.Fatalf("split request: status %d, prefill legs %d, remote prefills %d: %.200s", status, prefiller.PrefillLegs(), decoder.RemotePrefills(), body)
	}
	if u.PromptTokensDetails.CachedTokens < u.PromptTokens/2 {
		t.Errorf("the decoder prefilled %d of %d prompt tokens itself: the pulled KV cache was not used",
			u.PromptTokens-u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}
	if status, _, _ := send(""); status != http.StatusOK || prefiller.PrefillLegs() != 1 {
		t.Errorf("a whole request: status %d, prefill legs %d", status, prefiller.PrefillLegs())
	}
	if err := prefiller.SetFaults(Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	if status, _, body := send(prefiller.Addr()); status != http.StatusInternalServerError || !strings.Contains(body, "injected fault") {
		t.Errorf("a failed prefill leg: status %d, %.200s", status, body)
	}
}
