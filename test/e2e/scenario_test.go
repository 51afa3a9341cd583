package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/test/wait"
)

// The demo's pool-down scenario, briefly: with every llama replica refusing, llama requests are served by the
// simulated managed API (its own model name, over verified TLS, with its key); once they serve again,
// traffic is back on the pool.
func TestPoolDownScenarioOverflowsAndComesBack(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join(root, "examples/quickstart/policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	policy, err := SimulatedProviderPolicy(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	stack := stackFiles(t, map[string]string{"policy.yaml": string(policy), "envoy-xds.yaml": "repo:deploy/envoy/envoy-xds.yaml",
		"fleet.yaml": "repo:examples/quickstart/fleet.yaml"})
	t.Setenv("TOGETHER_API_KEY", SimulatedProviderKey)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: stack, EnvoyFile: "envoy-xds.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml",
		FreePorts: true, ManagedCADir: dir})
	if err != nil {
		t.Fatal(err)
	}
	send := func() (string, string) {
		resp, body := postChat(t, st, `{"model":"llama-3.3-70b","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != http.StatusOK {
			return "", body
		}
		return resp.Header.Get("x-simulated-replica"), body
	}
	if by, body := send(); !strings.HasPrefix(by, "llama70b-") {
		t.Fatalf("before the outage served by %q: %s", by, body)
	}
	if n, err := PoolDown(st.Fleet, "llama70b-", true); err != nil || n != 4 {
		t.Fatalf("pool down: %d replicas, %v", n, err)
	}
	wait.For(t, "llama requests served by the managed API", func() bool {
		by, body := send()
		return by == "together" && strings.Contains(body, "Llama-3.3-70B-Instruct-Turbo")
	})
	if _, err := PoolDown(st.Fleet, "llama70b-", false); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "llama requests back on the pool", func() bool {
		by, _ := send()
		return strings.HasPrefix(by, "llama70b-")
	})
}
