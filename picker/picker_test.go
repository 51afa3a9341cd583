package picker

import (
	"slices"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

const testPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  gateway: {maxEndpointsPerDecision: 3}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: m
    pools:
    - {name: a, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"]}
    - {name: b, hardwareClass: h200, engine: vllm, endpoints: ["10.0.1.1:1"]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// inFlight is an in-flight count with load[endpoint] requests started at each endpoint.
func inFlight(load map[string]int) *fleet.InFlight {
	f := &fleet.InFlight{}
	for ep, n := range load {
		for range n {
			f.Start(ep)
		}
	}
	return f
}

func TestLeastInFlight(t *testing.T) {
	snap, err := policies.Parse("p.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	model, _ := snap.Model("m")
	tests := []struct {
		name      string
		load      map[string]int
		wantFirst []string // any of these
		wantPool  string
		wantLen   int
	}{
		{"idle pool b wins when a is busy",
			map[string]int{"10.0.0.1:1": 2, "10.0.0.2:1": 1, "10.0.0.3:1": 1, "10.0.0.4:1": 3},
			[]string{"10.0.1.1:1"}, "b", 1},
		{"least loaded in a; fallbacks from the same pool by load",
			map[string]int{"10.0.0.1:1": 5, "10.0.0.2:1": 0, "10.0.0.3:1": 2, "10.0.0.4:1": 1, "10.0.1.1:1": 3},
			[]string{"10.0.0.2:1"}, "a", 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inflight := inFlight(tc.load)
			p := &LeastInFlight{InFlight: inflight}
			d, err := p.Pick(snap, Input{Model: model})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(tc.wantFirst, d.Endpoints[0]) || d.Pool.Name != tc.wantPool || len(d.Endpoints) != tc.wantLen {
				t.Fatalf("decision %s %v", d.Pool.Name, d.Endpoints)
			}
			for i := 1; i < len(d.Endpoints); i++ {
				if inflight.Count(d.Endpoints[i-1]) > inflight.Count(d.Endpoints[i]) && i > 1 {
					t.Errorf("fallbacks not ordered by load: %v", d.Endpoints)
				}
			}
		})
	}
}

func TestLeastInFlightRotatesTies(t *testing.T) {
	snap, _ := policies.Parse("p.yaml", []byte(testPolicy))
	model, _ := snap.Model("m")
	p := &LeastInFlight{InFlight: &fleet.InFlight{}}
	seen := map[string]int{}
	for range 50 {
		d, _ := p.Pick(snap, Input{Model: model})
		seen[d.Endpoints[0]]++
	}
	if len(seen) != 5 {
		t.Fatalf("idle fleet: picks went to %v, want all five replicas", seen)
	}
	for ep, n := range seen {
		if n != 10 {
			t.Errorf("%s picked %d times of 50, want 10", ep, n)
		}
	}
}
