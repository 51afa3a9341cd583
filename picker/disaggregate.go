package picker

import (
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/policies"
)

// disaggregate names a prefill endpoint for a request worth splitting (policies.Disaggregation,
// docs/disaggregation.md): one that leaves at least minUncachedTokens of its prompt to prefill after the prefix
// the decode endpoint holds, and that the split serves sooner, or that would stall the decoder's running
// requests past their TPOT target (worthSplitting). The prefiller is a replica of a prefill pool (or, when none can take it, of a pool
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
	uncached := dec.EstimatedPromptTokens - dec.ExpectedCachedTokens
	if uncached < least {
		return
	}
	// The pools made for prefill first; pools that do both only when none of those can take it.
	for _, role := range [...]string{policies.RolePrefill, policies.RoleBoth} {
		if ep, pool := d.prefiller(role, dec.Endpoints[0]); ep != "" {
			if !d.worthSplitting(dec.Endpoints[0], pool, uncached, dg) {
				return
			}
			dec.Prefill, dec.PrefillPool = ep, pool.Name
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
func (d *decision) prefiller(role, decoder string) (string, *policies.Pool) {
	key := d.prompt.hashes[0]
	var best string
	var bestPool *policies.Pool
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
				best, bestPool, bestScore = ep, pool, s
			}
		}
	}
	return best, bestPool
}

// worthSplitting weighs a request whose uncached prompt reached minUncachedTokens: it is split when the
// prefiller's class prefills it and the KV cache reaches the decoder (kvBytesPerToken × tokens ÷ transferGbps)
// sooner than the decoder would prefill it itself, or when prefilling it there would stall the decoder's
// running requests past the TPOT target — each running decode waits out the whole prefill, chunk by chunk,
// which over about priorServiceTokens more tokens must fit in what the target leaves beyond a decode step.
// Without the pools' speeds it is split, as the threshold alone says.
func (d *decision) worthSplitting(decoder string, prefillPool *policies.Pool, uncached int, dg *policies.Disaggregation) bool {
	c := d.candidate(decoder)
	prefillTPS := d.snap.Speed(prefillPool).PrefillTokensPerSecond
	if c == nil || c.prefillTPS <= 0 || prefillTPS <= 0 {
		return true
	}
	gbps := dg.TransferGbps
	if gbps <= 0 {
		gbps = policies.DefaultDisaggTransferGbps
	}
	whole := float64(uncached) / c.prefillTPS
	split := float64(uncached)/prefillTPS + float64(uncached)*float64(dg.KVBytesPerToken)*8/(gbps*1e9)
	if split < whole {
		return true
	}
	running := c.running
	if d.p.Engines != nil {
		if m, fresh := d.p.Engines.Metrics(decoder); fresh {
			running = max(running, m.Running)
		}
	}
	tpot := d.targets.TPOT.Seconds()
	if running < 1 || tpot <= 0 {
		return false
	}
	step := fullStepTime(c) * min(1, (running+1)/max(1, float64(c.pool.MaxConcurrency)))
	return whole > (tpot-step)*priorServiceTokens
}

// candidate is the decision's candidate at endpoint ep, nil when it is none.
func (d *decision) candidate(ep string) *scored {
	for i := range d.all {
		if d.all[i].endpoint == ep {
			return &d.all[i]
		}
	}
	return nil
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
