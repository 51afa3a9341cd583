package extproc

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/infergate/infergate/policies"
)

// A split request goes to its decode endpoint with x-prefiller-host-port naming its prefill endpoint, the header
// llm-d's routing sidecar in the decode pod reads; a short one goes whole, without it; a client's own value of
// the header never passes.
func TestSplitRequestNamesItsPrefiller(t *testing.T) {
	src, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.Replace(string(src), `      endpoints: ["10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000"]`,
		`      role: prefill
      endpoints: ["10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000"]
    - {name: llama70b-l40s, hardwareClass: l40s, engine: vllm, role: decode, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["10.0.1.21:8000"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840, minUncachedTokens: 1000}`, 1)
	snap, err := policies.Parse("policy.yaml", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{})
	for _, tc := range []struct {
		name, prompt string
		split        bool
	}{
		{"long", strings.Repeat("Read this whole contract before answering. ", 1000), true},
		{"short", "hi", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, _ := json.Marshal(map[string]any{"model": "llama-70b", "messages": []map[string]string{{"role": "user", "content": tc.prompt}}})
			s := h.open(t, modeBuffered, modeNone)
			s.send(postHeaders("/v1/chat/completions", keyAcme, "x-prefiller-host-port", "169.254.169.254:80"))
			if removed := s.recv().GetRequestHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(); !slices.Contains(removed, "x-prefiller-host-port") {
				t.Errorf("the client's x-prefiller-host-port was not removed: %v", removed)
			}
			s.send(reqBody(body, true))
			mut := s.recv().GetRequestBody().GetResponse().GetHeaderMutation()
			hdrs := setHeaders(mut)
			if hdrs["x-gateway-destination-endpoint"] != "10.0.1.21:8000" || hdrs["x-infergate-pool"] != "llama70b-l40s" {
				t.Fatalf("routed to %q in %q, want the decode endpoint", hdrs["x-gateway-destination-endpoint"], hdrs["x-infergate-pool"])
			}
			got := hdrs["x-prefiller-host-port"]
			switch {
			case tc.split && !strings.HasPrefix(got, "10.0.0.1"):
				t.Errorf("split request's prefiller %q, want an H200 prefill endpoint", got)
			case !tc.split && got != "":
				t.Errorf("a whole request names prefiller %q", got)
			}
		})
	}
}
