package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/gateway"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// Two gateway replicas sharing one Redis, as infergate serve runs them: each conversation group the first
// replica starts, the second sends to the same engine from its very first request, because the placement
// reached it over Redis pub/sub; and both say so in their /metrics.
func TestReplicasSharePlacementsThroughRedis(t *testing.T) {
	policy := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: llama-3.3-70b
    pools:
    - {name: llama70b-h200, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:18101", "127.0.0.1:18102"]}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`
	fleet := `timeScale: 0.05
replicas:
- {name: h200-0, addr: "127.0.0.1:18101", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200, numGPUBlocks: 2048, maxNumSeqs: 64}
- {name: h200-1, addr: "127.0.0.1:18102", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200, numGPUBlocks: 2048, maxNumSeqs: 64}
`
	dir := stackFiles(t, map[string]string{"envoy.yaml": "repo:deploy/envoy/envoy.yaml", "policy.yaml": policy, "fleet.yaml": fleet})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	redis := redistest.Start(t)
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml",
		FreePorts: true, RedisAddrs: []string{redis.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.AddReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*gateway.Gateway{st.Gateway, b.Gateway} {
		select { // each replica hears the other from its first request on
		case <-g.Placements.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("a replica never subscribed to the placements")
		}
	}
	// servedBy sends one request and names the engine that received it (requests go one at a time).
	servedBy := func(url, system, user string) string {
		t.Helper()
		before := make([]int64, len(st.Fleet.Replicas))
		for i, r := range st.Fleet.Replicas {
			before[i] = r.Received()
		}
		c := client(&Stack{URL: url}, "sk-demo-acme")
		if _, err := c.Chat.Completions.New(ctx, chatParams("llama-3.3-70b", system, user)); err != nil {
			t.Fatal(err)
		}
		for i, r := range st.Fleet.Replicas {
			if r.Received() > before[i] {
				return r.Name()
			}
		}
		t.Fatal("no engine received the request")
		return ""
	}
	const groups = 8
	for g := range groups {
		system := fmt.Sprintf("You are the assistant of team %d. %s", g, strings.Repeat("Answer from the team's handbook only. ", 60))
		first := servedBy(st.URL, system, "the first question")
		// The second replica has never seen this group: it knows where it lives only from the first.
		wantPlacement(t, b.MetricsURL, float64(g+1))
		for i := range 3 {
			if got := servedBy(b.URL, system, fmt.Sprintf("question %d", i)); got != first {
				t.Fatalf("group %d: the second replica sent request %d to %s, the first replica started the group on %s", g, i, got, first)
			}
		}
	}
}

// wantPlacement waits until the gateway's /metrics counts at least n placements learnt from other replicas.
func wantPlacement(t *testing.T, metricsURL string, n float64) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%v placements learnt", n), func() bool {
		return sumCounter(scrape(t, metricsURL), "infergate_placements_received_total",
			func(l map[string]string) bool { return l["result"] == "learnt" }) >= n
	})
}
