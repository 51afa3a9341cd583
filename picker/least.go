package picker

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// LeastInFlight picks the endpoint with the fewest of this process's requests in flight, rotating among ties so
// an idle fleet is still spread evenly.
type LeastInFlight struct {
	InFlight *fleet.InFlight
	rotor    atomic.Uint64
}

type candidate struct {
	pool     *policies.Pool
	endpoint string
	load     int64
}

// Pick implements Picker.
func (p *LeastInFlight) Pick(snap *policies.Snapshot, in Input) (Decision, error) {
	model := in.Model
	var all []candidate
	for i := range model.Pools {
		pool := &model.Pools[i]
		if !pool.ServesWhole() || in.Tenant != nil && !snap.PoolAllowed(in.Tenant, pool) {
			continue // a prefill-only pool takes no whole request
		}
		for _, ep := range pool.Endpoints {
			all = append(all, candidate{pool: pool, endpoint: ep})
		}
	}
	n := len(all)
	if n == 0 {
		return Decision{}, openai.NoCapacity(model.Name)
	}
	start := int(p.rotor.Add(1) % uint64(n))
	var best candidate
	found := false
	for j := 0; j < n; j++ {
		c := all[(start+j)%n]
		c.load = p.InFlight.Count(c.endpoint)
		if !found || c.load < best.load {
			best, found = c, true
		}
	}
	limit := snap.Gateway().MaxEndpointsPerDecision
	rest := make([]candidate, 0, len(best.pool.Endpoints))
	for _, ep := range best.pool.Endpoints {
		if ep != best.endpoint {
			rest = append(rest, candidate{pool: best.pool, endpoint: ep, load: p.InFlight.Count(ep)})
		}
	}
	slices.SortStableFunc(rest, func(a, b candidate) int { return int(a.load - b.load) })
	eps := make([]string, 0, min(limit, len(rest)+1))
	eps = append(eps, best.endpoint)
	for _, c := range rest {
		if len(eps) >= limit {
			break
		}
		eps = append(eps, c.endpoint)
	}
	return Decision{Pool: best.pool, Endpoints: eps, Adapter: in.Adapter, Load: best.load}, nil
}

// Observe implements Picker: the baseline learns nothing.
func (p *LeastInFlight) Observe(Decision, openai.Usage) {}

// Prefilled implements Picker: least-in-flight counts requests, not their prefill.
func (p *LeastInFlight) Prefilled(Decision) {}

// ObserveTiming implements Picker: the baseline learns nothing.
func (p *LeastInFlight) ObserveTiming(string, Decision, time.Duration, time.Duration) {}
