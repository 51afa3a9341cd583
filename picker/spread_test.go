package picker

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// The quickstart demo's traffic (eight shared system prompts over the quickstart policy) used to leave one
// healthy L40S replica of the 70B model without a single request: the faster H200s took the first groups, and
// the two groups left for the L40S pool could both hash to one replica. A replica holding no group now takes
// the next one its class would get, so every replica serves.
func TestEveryReplicaGetsAGroup(t *testing.T) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	topics := []string{"retail returns", "travel bookings", "tax questions", "IT helpdesk", "insurance claims", "recipes", "car rentals", "school timetables"}
	// Without a tenant the placement of new groups alone decides (requests finish at once, so no load bound
	// spreads them). Tenants' requests are placed by SLO and cost, and stay in flight: the enterprise tenant's
	// 70B requests all go to the H200s, cheaper per token than four L40S and faster (so only the pools that took
	// a group are checked there), and the free tier's to the L40S pool, the only one its tier allows.
	acme, _ := snap.TenantForKey("sk-demo-acme")
	initech, _ := snap.TenantForKey("sk-demo-initech")
	for _, tc := range []struct {
		tenant *policies.Tenant
		model  string
	}{{nil, "llama-3.3-70b"}, {nil, "qwen2.5-7b"}, {acme, "llama-3.3-70b"}, {acme, "qwen2.5-7b"}, {initech, "llama-3.3-70b"}} {
		model := tc.model
		m, _ := snap.Model(model)
		for seed := range 8 { // the groups' prompts, and so their rendezvous ranks, differ from demo to demo
			inflight := &fleet.InFlight{}
			p := NewAffinity(inflight, nil)
			served := map[string]int{}
			for i := range 160 {
				g := i % len(topics)
				system := strings.Repeat(fmt.Sprintf("You are the %s assistant (%d); follow the policy handbook section %d exactly and cite it. ", topics[g], seed, g), 30)
				d, err := p.Pick(snap, Input{Tenant: tc.tenant, Model: m, Request: request(t, system, fmt.Sprintf("Question %d: what applies here?", i))})
				var nc *NoCapacity
				if tc.tenant != nil && errors.As(err, &nc) && nc.Saturated {
					break // nothing finishes, so the fleet ends up overloaded: SLO placement refuses what it would serve late
				}
				if err != nil {
					t.Fatal(err)
				}
				served[d.Endpoints[0]]++
				if tc.tenant != nil {
					inflight.Start(d.Endpoints[0])
				}
			}
			for _, pool := range m.Pools {
				took := false
				for _, ep := range pool.Endpoints {
					took = took || served[ep] > 0
				}
				if tc.tenant != nil && (!took || !snap.PoolAllowed(tc.tenant, &pool)) {
					continue // the tenant's placement gave this pool no group, or its tier may not use it
				}
				for _, ep := range pool.Endpoints {
					if served[ep] == 0 {
						t.Errorf("%s, tenant %v, seed %d: %s (%s) served nothing: %v", model, tc.tenant != nil, seed, ep, pool.Name, served)
					}
				}
			}
		}
	}
}
