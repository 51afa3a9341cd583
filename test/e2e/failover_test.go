package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/test/wait"
)

// upstream is a stand-in HTTP server that records what it received.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	model, authorization string
}

func newUpstream(t *testing.T, answer func(w http.ResponseWriter, model string)) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/health" { // Envoy's active health check
			answer(w, "")
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &req)
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{req.Model, r.Header.Get("Authorization")})
		u.mu.Unlock()
		answer(w, req.Model)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

// When every replica of a pool fails (HTTP 500), Envoy — configured by infergate's xDS — retries on the other
// replica, ejects the failing ones (outlier detection) and fails the pool's traffic over to the model's managed
// API through the failover aggregate. On that leg the upstream ext_proc renames the body's model to the
// provider's and the credential injector adds the provider key; the self-hosted replicas never see the key.
func TestPoolFailsOverToManagedAPI(t *testing.T) {
	const key = "sk-provider-e2e"
	t.Setenv("INFERGATE_E2E_PROVIDER_KEY", key)
	var recovered atomic.Bool
	failing := func(w http.ResponseWriter, _ string) {
		w.Header().Set("content-type", "application/json")
		if recovered.Load() {
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"meta-llama/Llama-3.3-70B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"back"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"engine crashed","type":"server_error","code":null}}`)
	}
	replicas := []*upstream{newUpstream(t, failing), newUpstream(t, failing)}
	provider := newUpstream(t, func(w http.ResponseWriter, model string) {
		w.Header().Set("content-type", "application/json")
		if model != "meta-llama/Llama-3.3-70B-Instruct-Turbo" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"error":{"message":"model %q not found","type":"invalid_request_error","code":"model_not_found"}}`, model)
			return
		}
		_, _ = fmt.Fprintf(w, `{"id":"x","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`, model)
	})
	addr := func(u *upstream) string { return strings.TrimPrefix(u.URL, "http://") }

	policy := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: llama-3.3-70b
    pools:
    - {name: h200, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: [%q, %q]}
    fallbacks:
    - {name: together, baseURL: "%s/v1", model: meta-llama/Llama-3.3-70B-Instruct-Turbo, apiKeyFrom: "env:INFERGATE_E2E_PROVIDER_KEY", when: [unavailable]}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`, addr(replicas[0]), addr(replicas[1]), provider.URL)
	dir := stackFiles(t, map[string]string{"envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml", "policy.yaml": policy, "fleet.yaml": "replicas: []\n"})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// The stand-in replicas serve no /metrics: the gateway does not scrape them (it would find them stale and
	// send everything to the managed API itself), so the fail-over is Envoy's.
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", ScrapeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}

	send := func() (int, string) {
		resp, body := postChat(t, st, `{"model":"llama-3.3-70b","messages":[{"role":"user","content":"hi"}]}`)
		return resp.StatusCode, body
	}
	// The pool's outlier detection ejects a replica after 5 consecutive 5xx; each request tries up to three
	// times. Within a dozen requests both replicas are out and every request goes to the provider.
	deadline := time.Now().Add(30 * time.Second)
	served := 0
	for i := 0; served < 3; i++ {
		if i > 12 || time.Now().After(deadline) {
			t.Fatalf("no fail-over after %d requests: replicas saw %d and %d attempts, the provider %d",
				i, len(replicas[0].requests()), len(replicas[1].requests()), len(provider.requests()))
		}
		status, body := send()
		switch {
		case status == http.StatusOK:
			if !strings.Contains(body, `"model":"meta-llama/Llama-3.3-70B-Instruct-Turbo"`) {
				t.Errorf("answer %s", body)
			}
			served++
		case served > 0:
			t.Fatalf("request %d after fail-over: %d %s", i, status, body)
		}
	}
	t.Logf("attempts: replicas %d and %d, provider %d", len(replicas[0].requests()), len(replicas[1].requests()), len(provider.requests()))
	for _, r := range provider.requests() {
		if r.model != "meta-llama/Llama-3.3-70B-Instruct-Turbo" || r.authorization != "Bearer "+key {
			t.Errorf("the provider got model %q with authorization %q", r.model, r.authorization)
		}
	}
	for i, u := range replicas {
		seen := u.requests()
		// Envoy takes a failing replica out by outlier ejection (5 consecutive 5xx) or by its active health
		// check (2 failed probes, every 2 s), whichever comes first; either way it was tried first.
		if len(seen) == 0 {
			t.Errorf("replica %d saw no attempt: fail-over came before it was tried", i)
		}
		for _, r := range seen {
			if r.model != "meta-llama/Llama-3.3-70B-Instruct" || r.authorization != "" {
				t.Errorf("replica %d got model %q with authorization %q", i, r.model, r.authorization)
			}
		}
	}

	// The replicas recover: as soon as Envoy's health check sees them pass, the pool serves again and the paid
	// managed API stops getting traffic — seconds, not the 30 s × ejections of outlier detection.
	recovered.Store(true)
	wait.For(t, "traffic back on the recovered pool", func() bool {
		status, body := send()
		return status == http.StatusOK && strings.Contains(body, `"content":"back"`)
	})
}
