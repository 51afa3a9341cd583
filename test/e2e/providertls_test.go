package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleetsim"
)

// The managed API is reached over TLS that Envoy verifies (infergate's xDS gives the fallback cluster a
// validation context): a provider whose certificate chains to the policy's caFile serves the overflow with its
// own model name and the injected key; one whose certificate does not is never sent a request, so the key
// cannot leak to whoever answered.
func TestProviderCertificateIsVerified(t *testing.T) {
	const key = "sk-provider-tls"
	t.Setenv("INFERGATE_E2E_PROVIDER_KEY", key)
	for _, tc := range []struct {
		name    string
		trusted bool
	}{{"trusted", true}, {"untrusted", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			provider, err := fleetsim.StartManaged(ctx, fleetsim.ManagedConfig{Name: "together", Addr: "127.0.0.1:0",
				Model: "meta-llama/Llama-3.3-70B-Instruct-Turbo", APIKey: key, CAFile: filepath.Join(dir, "provider-ca.pem"),
				Latency: time.Millisecond, TimePerToken: time.Millisecond}, 1)
			if err != nil {
				t.Fatal(err)
			}
			caFile := filepath.Join(dir, "provider-ca.pem")
			if !tc.trusted {
				// Another provider's certificate: valid, but not the one this provider presents.
				if _, err := fleetsim.StartManaged(ctx, fleetsim.ManagedConfig{Name: "other", Addr: "127.0.0.1:0", Model: "x",
					APIKey: "k", CAFile: filepath.Join(dir, "other-ca.pem")}, 1); err != nil {
					t.Fatal(err)
				}
				caFile = filepath.Join(dir, "other-ca.pem")
			}
			// No self-hosted replica answers (its address refuses connections): every request overflows.
			policy := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: llama-3.3-70b
    pools:
    - {name: h200, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:1"]}
    fallbacks:
    - {name: together, baseURL: "https://%s/v1", model: meta-llama/Llama-3.3-70B-Instruct-Turbo, apiKeyFrom: "env:INFERGATE_E2E_PROVIDER_KEY", when: [unavailable], caFile: %q}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`, provider.Addr(), caFile)
			stack := stackFiles(t, map[string]string{"envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml", "policy.yaml": policy,
				"fleet.yaml": "replicas: []\n"})
			st, err := Start(ctx, Options{Root: stack, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", ScrapeInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			// Envoy ejects the dead replica (outlier detection) within a few requests; then the aggregate sends
			// everything to the managed API.
			var statuses []int
			var last string
			for i := 0; i < 15 && (len(statuses) == 0 || statuses[len(statuses)-1] != http.StatusOK); i++ {
				resp, body := postChat(t, st, `{"model":"llama-3.3-70b","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
				statuses, last = append(statuses, resp.StatusCode), body
			}
			served := provider.Received()
			final := statuses[len(statuses)-1]
			switch {
			case tc.trusted && (final != http.StatusOK || !strings.Contains(last, "Llama-3.3-70B-Instruct-Turbo") || served == 0):
				t.Errorf("statuses %v, last %s, provider served %d: want the overflow served", statuses, last, served)
			case !tc.trusted && (served != 0 || final < 500 || len(statuses) != 15):
				t.Errorf("statuses %v, provider served %d: an unverified provider must get nothing", statuses, served)
			}
		})
	}
}
