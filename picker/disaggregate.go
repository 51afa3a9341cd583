package picker

import (
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/policies"
)

// disaggregate names a prefill endpoint for a request worth splitting (policies.Disaggregation,
// docs/disaggregation.md): one that leaves at least minUncachedTokens of its prompt to prefill after the prefix
// the decode endpoint holds. The prefiller is a replica of a prefill pool (or, when none can take it, of a pool
// that does both), other than the decode endpoint, with fresh metrics and room in its queue, chosen by
// rendezvous on the prompt's first block among them: a prefix keeps its prefiller, whose cache holds it, and
// prefixes spread over the prefill pool. Without one the request runs whole on the decode endpoint.
func (d *decision) disaggregate(dec *Decision) {
	dg := d.in.Model.Disaggregation
	if dg == nil || dec.Fallback != nil || dec.Pool == nil || len(dec.Endpoints) == 0 || len(d.prompt.hashes) == 0 {
		return
	}
	least := dg.MinUncachedTokens
	if least == 0 {
		least = policies.DefaultDisaggMinUncachedTokens
	}
	if dec.EstimatedPromptTokens-dec.ExpectedCachedTokens < least {
		return
	}
	// The pools made for prefill first; pools that do both only when none of those can take it.
	for _, role := range [...]string{policies.RolePrefill, policies.RoleBoth} {
		if ep := d.prefiller(role, dec.Endpoints[0]); ep != "" {
			dec.Prefill = ep
			// Envoy's first retry goes to the decode replica's own engine, past its sidecar: it prefills the
			// request itself when the prefill leg failed (policies.Pool.EngineEndpoints).
			if engine := dec.Pool.EngineEndpoint(dec.Endpoints[0]); engine != "" {
				dec.Endpoints = slices.Insert(slices.Clip(dec.Endpoints), 1, engine)
			}
			return
		}
	}
}

// prefiller chooses among the endpoints of the model's pools of a role ("both" includes pools that state none),
// other than the decoder, by rendezvous on the prompt's first block.
func (d *decision) prefiller(role, decoder string) string {
	key := d.prompt.hashes[0]
	var best string
	var bestScore uint64
	for i := range d.in.Model.Pools {
		pool := &d.in.Model.Pools[i]
		r := pool.Role
		if r == "" {
			r = policies.RoleBoth
		}
		if r != role || d.in.Tenant != nil && !d.snap.PoolAllowed(d.in.Tenant, pool) {
			continue
		}
		for _, ep := range pool.Endpoints {
			if ep == decoder || !d.canPrefill(ep) {
				continue
			}
			if s := xxh3.HashStringSeed(ep, key); best == "" || s > bestScore {
				best, bestScore = ep, s
			}
		}
	}
	return best
}

// prefillCooldown is how long a prefill endpoint a split request failed on is named to no other: llm-d's sidecar
// answers a failed prefill leg's error to the client (and Envoy's retry goes to the same prefiller), so a
// failing prefiller must leave the choice quickly, and come back once it may have recovered.
const prefillCooldown = 30 * time.Second

// PrefillFailed hears that a split request failed (5xx or reset): its prefiller is named to no other request for
// prefillCooldown (the director calls it; a failed decode leg costs the prefiller a rest it did not need).
func (p *Affinity) PrefillFailed(ep string) {
	p.failedPrefillers.Store(ep, p.now().Add(prefillCooldown))
}

// canPrefill says whether an endpoint may take a prefill leg: not resting after a failed one, fresh metrics and
// its queue below the routing's maxWaiting (every endpoint may, without engine metrics).
func (d *decision) canPrefill(ep string) bool {
	if until, ok := d.p.failedPrefillers.Load(ep); ok {
		if d.p.now().Before(until.(time.Time)) {
			return false
		}
		d.p.failedPrefillers.CompareAndDelete(ep, until)
	}
	if d.p.Engines == nil {
		return true
	}
	m, fresh := d.p.Engines.Metrics(ep)
	return fresh && m.Waiting < float64(d.routing.MaxWaiting)
}
