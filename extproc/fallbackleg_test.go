package extproc

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// An upstream ext_proc stream (one attempt to a managed-API cluster) renames the model to the provider's and
// does nothing else: no tenant, no quota, no routing headers, no settlement.
func TestFallbackLegRenamesModel(t *testing.T) {
	snap, err := policies.Parse("p.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: llama-3.3-70b
    pools: [{name: p, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:1"]}]
    fallbacks:
    - {name: together, baseURL: "https://api.together.xyz/v1", model: meta-llama/Llama-3.3-70B-Instruct-Turbo, apiKeyFrom: "env:NO_SUCH_KEY", when: [unavailable]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{})
	tests := []struct {
		name, model, fallback, body string
		want                        string // the model the provider gets; "" = body unchanged
	}{
		{"a retried request names the pool's model", "llama-3.3-70b", "together",
			`{"model":"meta-llama/Llama-3.3-70B-Instruct","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			"meta-llama/Llama-3.3-70B-Instruct-Turbo"},
		{"the client's model name (ext_proc bypassed)", "llama-3.3-70b", "together",
			`{"model":"llama-3.3-70b","messages":[{"role":"user","content":"hi"}]}`, "meta-llama/Llama-3.3-70B-Instruct-Turbo"},
		{"overflow already renamed by the ext_proc", "llama-3.3-70b", "together",
			`{"model":"meta-llama/Llama-3.3-70B-Instruct-Turbo","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"a fallback the policy no longer lists", "llama-3.3-70b", "fireworks",
			`{"model":"meta-llama/Llama-3.3-70B-Instruct","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"a body that is not a request", "llama-3.3-70b", "together", `{"model":`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, contract.LegModelMetadata, tc.model, contract.LegFallbackMetadata, tc.fallback)
			c, err := h.client.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s := &stream{t: t, c: c, cancel: cancel, reqMode: modeBuffered, respMode: modeNone}
			s.send(postHeaders("/v1/chat/completions", "", "x-infergate-model", tc.model))
			if hr := s.recv().GetRequestHeaders(); hr == nil || hr.GetResponse().GetHeaderMutation() != nil {
				t.Fatalf("headers answered %v, want a plain CONTINUE", hr)
			}
			s.send(reqBody([]byte(tc.body), true))
			cr := s.recv().GetRequestBody().GetResponse()
			got := cr.GetBodyMutation().GetBody()
			if tc.want == "" {
				if got != nil {
					t.Fatalf("body rewritten to %s", got)
				}
				return
			}
			var parsed map[string]any
			if err := json.Unmarshal(got, &parsed); err != nil {
				t.Fatalf("rewritten body %q: %v", got, err)
			}
			if parsed["model"] != tc.want || parsed["messages"] == nil {
				t.Errorf("provider gets %s", got)
			}
			if cl := setHeaders(cr.GetHeaderMutation())["content-length"]; cl != strconv.Itoa(len(got)) {
				t.Errorf("content-length %q for a %d-byte body", cl, len(got))
			}
		})
	}
	h.noSettlement()
}

// The fallback leg's rename reads bodies Envoy forwards: it never panics, and what it returns is JSON naming
// the provider's model.
func FuzzRenameModel(f *testing.F) {
	f.Add(`{"model":"meta-llama/Llama-3.3-70B-Instruct","messages":[{"role":"user","content":"hi"}]}`, uint8(0))
	f.Add(`{"model":"x","prompt":"\u0001","model":"y"}`, uint8(1))
	f.Add(`{"model":"x","input":`+strings.Repeat("[", 300), uint8(2))
	f.Fuzz(func(t *testing.T, body string, ep uint8) {
		const provider = "meta-llama/Llama-3.3-70B-Instruct-Turbo"
		out, ok := renameModel(openai.Endpoint(ep%3+1), []byte(body), provider)
		if !ok {
			return
		}
		var doc map[string]any
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatalf("renamed body is not JSON: %v\n%q", err, out)
		}
		if doc["model"] != provider {
			t.Fatalf("model %v after rename", doc["model"])
		}
	})
}
