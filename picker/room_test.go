package picker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// With the admission queue, an endpoint's room counts what this gateway (and, by symmetry, the other replicas)
// sent since the engine's reading, and each tier fills it to its headroom: of the batch slots plus maxWaiting
// when the pool states its maxConcurrency, of maxWaiting alone otherwise; a higher tier's reserve is left free
// by the tiers below it, less what its requests there hold.
func TestRoomWithAdmission(t *testing.T) {
	const ep = "10.0.0.1:1"
	policy := func(maxConcurrency, replicas int, gold string) *policies.Snapshot {
		t.Helper()
		if gold != "" {
			gold = ", " + gold
		}
		src := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {maxWaiting: 2}
  admission: {}
  quotas: {gatewayReplicas: %d}
  hardwareClasses:
    h: {prefillTokensPerSecond: 1000, decodeTokensPerSecond: 100}
    g: {prefillTokensPerSecond: 1000, decodeTokensPerSecond: 100}
  tiers:
    gold: {priority: 10%s}
    silver: {priority: 5}
    tin: {headroom: 0.5}
  models:
  - name: m
    pools:
    - {name: p, hardwareClass: h, engine: vllm, maxConcurrency: %d, endpoints: [%q]}
    - {name: q, hardwareClass: g, engine: vllm, maxConcurrency: 8, endpoints: ["10.0.0.9:1"]} # no metrics: never a candidate
  tenants:
  - {name: g, tier: gold, apiKeys: ["sha256:%064x"], models: ["*"]}
  - {name: t, tier: tin, apiKeys: ["sha256:%064x"], models: ["*"]}
  - {name: s, tier: silver, apiKeys: ["sha256:%064x"], models: ["*"]}
`, replicas, gold, maxConcurrency, ep, 1, 2, 3)
		snap, err := policies.Parse("p.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	tests := []struct {
		name                     string
		maxConcurrency, replicas int
		running, waiting         float64
		sent                     int // requests this gateway sent since the reading
		tier                     string
		want                     bool
		gold                     string // gold's further fields: its reserve
		held                     int    // gold's requests this gateway has in flight there
	}{
		{"waiting below maxWaiting", 0, 1, 0, 1, 0, "gold", true, "", 0},
		{"waiting at maxWaiting", 0, 1, 0, 2, 0, "gold", false, "", 0},
		{"what was sent since the reading counts", 0, 1, 0, 1, 1, "gold", false, "", 0},
		{"a half headroom fills half of maxWaiting", 0, 1, 0, 1, 0, "tin", false, "", 0},
		{"two replicas: each send counts twice", 0, 2, 0, 0, 1, "gold", false, "", 0},
		{"batch slots: a free slot is room for every tier", 8, 1, 4, 0, 0, "tin", true, "", 0},
		{"batch slots: the lower tier leaves the rest", 8, 1, 5, 0, 0, "tin", false, "", 0},
		{"batch slots: the higher tier fills them and maxWaiting", 8, 1, 8, 1, 0, "gold", true, "", 0},
		{"batch slots: full", 8, 1, 8, 2, 0, "gold", false, "", 0},
		{"a reserve above is left free", 8, 1, 3, 0, 0, "silver", false, "reserve: {m: 0.7}", 0},
		{"below the reserve there is room", 8, 1, 2, 0, 0, "silver", true, "reserve: {m: 0.7}", 0},
		{"what the reserving tier holds fills its reserve", 8, 1, 9, 0, 0, "silver", true, "reserve: {m: 0.7}", 7},
		{"held in part, the rest is left free", 8, 1, 4, 0, 0, "silver", false, "reserve: {m: 0.7}", 1},
		{"held in part, what it holds is room", 8, 1, 3, 0, 0, "silver", true, "reserve: {m: 0.7}", 1},
		{"no reserve where its tier may not go", 8, 1, 8, 0, 0, "silver", true, "reserve: {m: 0.7}, hardwareClasses: [g]", 0},
		{"two replicas: each held request counts twice", 8, 2, 4, 0, 0, "silver", true, "reserve: {m: 0.7}", 1},
		{"under both, the lower of headroom and reserve", 8, 1, 4, 0, 0, "tin", false, "reserve: {m: 0.6}", 0},
		{"under both, headroom when it is the lower", 8, 1, 5, 0, 0, "tin", false, "reserve: {m: 0.3}", 0},
		{"a reserve does not hold back its own tier", 8, 1, 8, 1, 0, "gold", true, "reserve: {m: 0.7}", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := policy(tc.maxConcurrency, tc.replicas, tc.gold)
			inflight := &fleet.InFlight{}
			at := time.Unix(100, 0)
			p := NewAffinity(inflight, engines{ep: {Running: tc.running, Waiting: tc.waiting, At: at}})
			for range tc.held {
				inflight.Start(ep)
				inflight.Hold(ep, "gold")
			}
			inflight.SinceReading(ep, at) // the gateway looked at the reading before it sent
			for range tc.sent {
				inflight.Start(ep)
			}
			tenant := &snap.Policy.Spec.Tenants[map[string]int{"gold": 0, "tin": 1, "silver": 2}[tc.tier]]
			m, _ := snap.Model("m")
			_, err := p.Pick(snap, Input{Tenant: tenant, Model: m, Queueing: true})
			var nc *NoCapacity
			if got := err == nil; got != tc.want || (err != nil && (!errors.As(err, &nc) || !nc.Saturated)) {
				t.Errorf("room %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}
