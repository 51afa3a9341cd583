package policies

import (
	"slices"
	"testing"
	"time"
)

const regionsDoc = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  regions:
  - {name: us-east, rtt: {us-west: 60ms}}
  - {name: us-west, rtt: {us-east: 70ms, on-prem: 30ms}}
  - {name: on-prem, failover: [us-west]}
  - {name: eu-west, rtt: {us-east: 80ms}}
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  tiers:
    eu: {residency: [eu-west, on-prem]}
    std: {}
  models:
  - name: llama
    pools:
    - {name: a, hardwareClass: h100, engine: vllm, region: us-east, endpoints: ["10.0.0.1:8000"]}
    - {name: b, hardwareClass: h100, engine: vllm, region: on-prem, endpoints: ["10.0.0.2:8000"]}
    fallbacks:
    - {name: anywhere, baseURL: "https://api.together.xyz/v1", model: m, apiKeyFrom: "env:K", when: [saturated]}
    - {name: eu, baseURL: "https://eu.example.com/v1", model: m, apiKeyFrom: "env:K", when: [saturated], region: eu-west}
  tenants:
  - {name: free, tier: std, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
  - {name: bank, tier: eu, apiKeys: ["sha256:bbb8fab5ab2c83254e4969c119cdbb68880ee066c42a36223f8ac83fff2d5b96"], models: ["*"]}
  - {name: clinic, tier: eu, residency: [on-prem, us-east], apiKeys: ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"], models: ["*"]}
`

// A pair's RTT is stated once or twice (each side keeps its own), or is the default; the failover order is the
// policy's, or every other region nearest first.
func TestRegionsCompileRTTAndFailoverOrder(t *testing.T) {
	snap, err := Parse("p.yaml", []byte(regionsDoc))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from, to string
		want     time.Duration
	}{
		{"us-east", "us-west", 60 * time.Millisecond},
		{"us-west", "us-east", 70 * time.Millisecond},
		{"on-prem", "us-west", 30 * time.Millisecond},
		{"us-east", "eu-west", 80 * time.Millisecond},
		{"on-prem", "eu-west", DefaultRegionRTT},
		{"us-east", "us-east", 0},
		{"us-east", "", 0},
	} {
		if got := snap.RegionRTT(tc.from, tc.to); got != tc.want {
			t.Errorf("RTT %s → %s = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
	for local, want := range map[string][]string{
		"us-east": {"us-east", "us-west", "eu-west", "on-prem"},
		"us-west": {"us-west", "on-prem", "us-east", "eu-west"},
		"on-prem": {"on-prem", "us-west"},
		"mars":    nil,
		"":        nil,
	} {
		if got := snap.RegionOrder(local); !slices.Equal(got, want) {
			t.Errorf("order from %q = %v, want %v", local, got, want)
		}
	}
	if !snap.Regional() || snap.RegionFailback() != DefaultRegionFailback {
		t.Errorf("regional %v, failback %v", snap.Regional(), snap.RegionFailback())
	}
}

// A tenant's residency is its tier's narrowed by its own; pools and fallbacks outside it are not allowed, and a
// fallback without a region is outside every residency.
func TestResidencyBoundsPoolsAndFallbacks(t *testing.T) {
	snap, err := Parse("p.yaml", []byte(regionsDoc))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("llama")
	a, b := &m.Pools[0], &m.Pools[1]
	anywhere, eu := &m.Fallbacks[0], &m.Fallbacks[1]
	for _, tc := range []struct {
		tenant    string
		residency []string
		pools     [2]bool // a (us-east), b (on-prem)
		fallbacks [2]bool // anywhere, eu
	}{
		{"free", nil, [2]bool{true, true}, [2]bool{true, true}},
		{"bank", []string{"eu-west", "on-prem"}, [2]bool{false, true}, [2]bool{false, true}},
		{"clinic", []string{"on-prem"}, [2]bool{false, true}, [2]bool{false, false}},
	} {
		tn, _ := snap.Tenant(tc.tenant)
		if got := snap.Residency(tn); !slices.Equal(got, tc.residency) {
			t.Errorf("%s: residency %v, want %v", tc.tenant, got, tc.residency)
		}
		pools := [2]bool{snap.PoolAllowed(tn, a), snap.PoolAllowed(tn, b)}
		fallbacks := [2]bool{snap.FallbackAllowed(tn, anywhere), snap.FallbackAllowed(tn, eu)}
		if pools != tc.pools || fallbacks != tc.fallbacks {
			t.Errorf("%s: pools %v fallbacks %v, want %v %v", tc.tenant, pools, fallbacks, tc.pools, tc.fallbacks)
		}
	}
	// Without regions nothing is pinned and nothing ranks.
	plain, err := Parse("p.yaml", []byte(minimalPolicy("")))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Regional() || plain.RegionOrder("us-east") != nil {
		t.Error("a policy without regions has a region order")
	}
}
