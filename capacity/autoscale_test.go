package capacity

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
)

type engines map[string]fleet.EngineMetrics

func (e engines) Metrics(addr string) (fleet.EngineMetrics, bool) { m, ok := e[addr]; return m, ok }

func scalePolicy(t *testing.T, replicas int) (*policies.Snapshot, *policies.Model, *policies.Pool) {
	t.Helper()
	var eps []string
	for i := range replicas {
		eps = append(eps, fmt.Sprintf("\"10.0.0.%d:8000\"", i+1))
	}
	snap, err := policies.Parse("p.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {gpu: h100, costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  slo: {ttft: 500ms, tpot: 50ms}
  models:
  - name: m
    pools:
    - {name: p, hardwareClass: h100, engine: vllm, maxConcurrency: 8, endpoints: [`+strings.Join(eps, ", ")+`]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	return snap, m, &m.Pools[0]
}

func load(replicas int, waiting, kv float64) engines {
	e := engines{}
	for i := range replicas {
		e[fmt.Sprintf("10.0.0.%d:8000", i+1)] = fleet.EngineMetrics{Waiting: waiting, Running: 8, KVUtil: kv}
	}
	return e
}

func TestAutoscalerRules(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		engines  engines
		ttft     time.Duration
		want     int
		reason   string
	}{
		{"queues past twice the batch", 4, load(4, 40, 0.9), 100 * time.Millisecond, 8, "queue"},
		{"a little queue, fast first tokens: hold", 4, load(4, 8, 0.7), 100 * time.Millisecond, 4, ""},
		{"TTFT p95 above 80% of the target", 4, load(4, 0, 0.6), 450 * time.Millisecond, 5, "TTFT"},
		{"never below the warm pool", 1, load(1, 0, 0.1), 10 * time.Millisecond, 2, "warm pool"},
	} {
		snap, m, p := scalePolicy(t, tc.replicas)
		clock := fakeclock.New()
		a := NewAutoscaler(policies.NewStaticStore(snap), tc.engines, clock.Now)
		for range 100 {
			a.Settled(director.Settlement{Routed: true, Model: "m", Pool: "p", Outcome: director.OutcomeOK, HardwareClass: "h100",
				Timing: director.Timing{TTFT: tc.ttft, Chunked: true}})
		}
		d := a.Decide(snap, m, p)
		if d.Desired != tc.want || !strings.Contains(d.Reason, tc.reason) {
			t.Errorf("%s: %+v, want %d (%q)", tc.name, d, tc.want, tc.reason)
		}
	}
}

// Scaling in waits five calm minutes and takes one replica at a time.
func TestAutoscalerScalesInSlowly(t *testing.T) {
	snap, m, p := scalePolicy(t, 4)
	clock := fakeclock.New()
	e := load(4, 0, 0.2)
	a := NewAutoscaler(policies.NewStaticStore(snap), e, clock.Now)
	if d := a.Decide(snap, m, p); d.Desired != 4 {
		t.Fatalf("at once: %+v", d)
	}
	clock.Advance(4 * time.Minute)
	if d := a.Decide(snap, m, p); d.Desired != 4 {
		t.Fatalf("after 4 calm minutes: %+v", d)
	}
	clock.Advance(time.Minute)
	if d := a.Decide(snap, m, p); d.Desired != 3 {
		t.Fatalf("after 5 calm minutes: %+v", d)
	}
	// The figure stays until the pool has shrunk: every scraper, and the HPA's stabilisation window, sees it.
	clock.Advance(30 * time.Second)
	if d := a.Decide(snap, m, p); d.Desired != 3 {
		t.Fatalf("a scrape later: %+v", d)
	}
	// Shrunk to 3: the next scale-in waits five calm minutes of its own.
	snap3, m3, p3 := scalePolicy(t, 3)
	if d := a.Decide(snap3, m3, p3); d.Desired != 3 {
		t.Fatalf("at 3 replicas: %+v", d)
	}
	clock.Advance(5 * time.Minute)
	if d := a.Decide(snap3, m3, p3); d.Desired != 2 {
		t.Fatalf("at 3 replicas, 5 calm minutes on: %+v", d)
	}
	// A burst resets the calm: the next scale-in waits another five minutes.
	e["10.0.0.1:8000"] = fleet.EngineMetrics{Waiting: 100, Running: 8, KVUtil: 0.9}
	if d := a.Decide(snap, m, p); d.Desired <= 4 {
		t.Fatalf("under a burst: %+v", d)
	}
	e["10.0.0.1:8000"] = fleet.EngineMetrics{KVUtil: 0.2}
	clock.Advance(4 * time.Minute)
	if d := a.Decide(snap, m, p); d.Desired != 4 {
		t.Fatalf("4 minutes after the burst: %+v", d)
	}
}
