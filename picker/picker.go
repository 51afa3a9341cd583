// Package picker chooses the pool and replica for one request. This first picker sends each request to the
// endpoint with the fewest requests in flight from this process; the KV-affinity picker replaces it.
package picker

import (
	"slices"
	"sync/atomic"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Decision is where one request goes: a pool, and endpoints of that pool in order of preference (the first
// is chosen; the rest are what Envoy's override_host retries next) — or, when every self-hosted endpoint is
// saturated or unavailable, the model's managed fallback.
type Decision struct {
	Pool      *policies.Pool
	Endpoints []string
	Fallback  *policies.Fallback
}

// Target is what the decision is counted against for in-flight load: the chosen endpoint, or the fallback.
func (d Decision) Target(model string) string {
	if d.Fallback != nil {
		return "fallback/" + model + "/" + d.Fallback.Name
	}
	return d.Endpoints[0]
}

// Picker chooses a Decision for a request to a model. An error is an *openai.Error to return to the client.
type Picker interface {
	Pick(snap *policies.Snapshot, model *policies.Model, req *openai.Request) (Decision, error)
}

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
func (p *LeastInFlight) Pick(snap *policies.Snapshot, model *policies.Model, _ *openai.Request) (Decision, error) {
	n := 0
	for i := range model.Pools {
		n += len(model.Pools[i].Endpoints)
	}
	if n == 0 {
		return Decision{}, openai.NoCapacity(model.Name)
	}
	start := int(p.rotor.Add(1) % uint64(n))
	var best candidate
	found := false
	for j := 0; j < n; j++ {
		pool, ep := nth(model, (start+j)%n)
		load := p.InFlight.Count(ep)
		if !found || load < best.load {
			best, found = candidate{pool: pool, endpoint: ep, load: load}, true
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
	return Decision{Pool: best.pool, Endpoints: eps}, nil
}

// nth returns the i-th endpoint of a model counting across its pools in policy order.
func nth(model *policies.Model, i int) (*policies.Pool, string) {
	for j := range model.Pools {
		pool := &model.Pools[j]
		if i < len(pool.Endpoints) {
			return pool, pool.Endpoints[i]
		}
		i -= len(pool.Endpoints)
	}
	return nil, ""
}

// Served is the model name the destination serves (the body's model is rewritten to it).
func (d Decision) Served() string {
	if d.Fallback != nil {
		return d.Fallback.Model
	}
	return d.Pool.ServedModel
}
