package policies

import (
	"math"
	"testing"
)

// A pool's own speeds replace its class's; the price stays the class's, and the cost per token follows the
// pool's decode speed.
func TestPoolSpeedOverridesTheClass(t *testing.T) {
	snap, err := Parse("p.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    l40s: {costPerHour: 1.08, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  models:
  - name: small
    pools:
    - {name: fast, hardwareClass: l40s, engine: vllm, prefillTokensPerSecond: 40000, decodeTokensPerSecond: 3000, endpoints: ["10.0.0.1:8000"]}
    - {name: stated, hardwareClass: l40s, engine: vllm, endpoints: ["10.0.0.2:8000"]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("small")
	fast, stated := snap.Speed(&m.Pools[0]), snap.Speed(&m.Pools[1])
	if fast != (PoolSpeed{PrefillTokensPerSecond: 40000, DecodeTokensPerSecond: 3000, CostPerHour: 1.08}) {
		t.Errorf("fast pool: %+v", fast)
	}
	if stated != (PoolSpeed{PrefillTokensPerSecond: 7000, DecodeTokensPerSecond: 1200, CostPerHour: 1.08}) {
		t.Errorf("pool without speeds: %+v", stated)
	}
	if got, want := fast.CostPerToken(), 1.08/3600/3000; math.Abs(got-want) > 1e-15 {
		t.Errorf("cost per token %v, want %v", got, want)
	}
	if (PoolSpeed{CostPerHour: 1}).CostPerToken() != 0 {
		t.Error("a pool without a decode speed has a cost per token")
	}
	if r := snap.Routing(); r.Placement != PlacementSLO || r.SLOMargin != DefaultSLOMargin {
		t.Errorf("routing defaults %q %v", r.Placement, r.SLOMargin)
	}
}
