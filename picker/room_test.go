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
// when the pool states its maxConcurrency, of maxWaiting alone otherwise.
func TestRoomWithAdmission(t *testing.T) {
	const ep = "10.0.0.1:1"
	policy := func(maxConcurrency, replicas int) *policies.Snapshot {
		t.Helper()
		src := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {maxWaiting: 2}
  admission: {}
  quotas: {gatewayReplicas: %d}
  hardwareClasses: {h: {prefillTokensPerSecond: 1000, decodeTokensPerSecond: 100}}
  tiers:
    gold: {priority: 10}
    tin: {headroom: 0.5}
  models:
  - name: m
    pools: [{name: p, hardwareClass: h, engine: vllm, maxConcurrency: %d, endpoints: [%q]}]
  tenants:
  - {name: g, tier: gold, apiKeys: ["sha256:%064x"], models: ["*"]}
  - {name: t, tier: tin, apiKeys: ["sha256:%064x"], models: ["*"]}
`, replicas, maxConcurrency, ep, 1, 2)
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
	}{
		{"waiting below maxWaiting", 0, 1, 0, 1, 0, "gold", true},
		{"waiting at maxWaiting", 0, 1, 0, 2, 0, "gold", false},
		{"what was sent since the reading counts", 0, 1, 0, 1, 1, "gold", false},
		{"a half headroom fills half of maxWaiting", 0, 1, 0, 1, 0, "tin", false},
		{"two replicas: each send counts twice", 0, 2, 0, 0, 1, "gold", false},
		{"batch slots: a free slot is room for every tier", 8, 1, 4, 0, 0, "tin", true},
		{"batch slots: the lower tier leaves the rest", 8, 1, 5, 0, 0, "tin", false},
		{"batch slots: the higher tier fills them and maxWaiting", 8, 1, 8, 1, 0, "gold", true},
		{"batch slots: full", 8, 1, 8, 2, 0, "gold", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := policy(tc.maxConcurrency, tc.replicas)
			inflight := &fleet.InFlight{}
			at := time.Unix(100, 0)
			p := NewAffinity(inflight, engines{ep: {Running: tc.running, Waiting: tc.waiting, At: at}})
			inflight.SinceReading(ep, at) // the gateway looked at the reading before it sent
			for range tc.sent {
				inflight.Start(ep)
			}
			tenant := &snap.Policy.Spec.Tenants[0]
			if tc.tier == "tin" {
				tenant = &snap.Policy.Spec.Tenants[1]
			}
			m, _ := snap.Model("m")
			_, err := p.Pick(snap, Input{Tenant: tenant, Model: m, Queueing: true})
			var nc *NoCapacity
			if got := err == nil; got != tc.want || (err != nil && (!errors.As(err, &nc) || !nc.Saturated)) {
				t.Errorf("room %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}
