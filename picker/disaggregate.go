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
// requests past their TPOT target (worthSplitting). The prefiller is a replica of a prefill pool (or, when none
// can take it, of a pool that does both), other than the decode endpoint, with fresh metrics and room in its
// queue (prefiller). Without one the request runs whole on the decode endpoint.
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
		ep, pool := d.prefiller(role, dec.Endpoints[0], dec.Pool.Region)
		if ep == "" {
			continue
		}
		worth, ttft := d.worthSplitting(dec.Endpoints[0], ep, pool, uncached, dg)
		if !worth {
			return
		}
		dec.Prefill, dec.PrefillPool = ep, pool.Name
		if dec.Predicted.set {
			d.predictSplit(dec, ttft)
		}
		// Envoy's first retry goes to the decode replica's own engine, past its sidecar: it prefills the
		// request itself when the prefill leg failed (policies.Pool.EngineEndpoints).
		if engine := dec.Pool.EngineEndpoint(dec.Endpoints[0]); engine != "" {
			dec.Endpoints = slices.Insert(slices.Clip(dec.Endpoints), 1, engine)
		}
		return
	}
}

// predictSplit moves a split request's prefill, in SLO placement's books, from its decoder to its prefiller: the
// decoder prefills only the last token, on the KV cache it pulls, and the prefiller's queue holds the prompt
// until its first token passes (Prefilled). The TTFT expected is the prefiller's and the transfer.
func (d *decision) predictSplit(dec *Decision, ttft time.Duration) {
	d.p.pred.prefilled(dec.Endpoints[0], dec.Predicted)
	if ttft > 0 {
		dec.Predicted.TTFT = ttft
	}
	if c := d.candidate(dec.Prefill); c != nil && c.pred.set {
		pp := c.pred
		pp.sentAt = d.now
		d.p.pred.sentPrefill(dec.Prefill, pp)
		dec.prefillPred = pp
	}
}

// prefiller chooses among the endpoints of the model's pools of a role ("both" includes pools that state none),
// other than the decoder, that may take a prefill leg (canPrefill). Under SLO placement, among those it
// predicts for (pools that also take whole requests), the one predicted to prefill the prompt soonest, its
// queue and cached prefix counted; otherwise by rendezvous on the prompt's first block: a prefix keeps its
// prefiller, whose cache holds it, and prefixes spread over the pool. Only pools of the decoder's region
// prefill for it: a KV cache does not cross regions.
func (d *decision) prefiller(role, decoder, region string) (string, *policies.Pool) {
	key := d.prompt.hashes[0]
	var best, soonest string
	var bestPool, soonestPool *policies.Pool
	var bestScore uint64
	var soonestTTFT time.Duration
	for i := range d.in.Model.Pools {
		pool := &d.in.Model.Pools[i]
		r := pool.Role
		if r == "" {
			r = policies.RoleBoth
		}
		if r != role || pool.Region != region || d.in.Tenant != nil && !d.snap.PoolAllowed(d.in.Tenant, pool) {
			continue
		}
		for _, ep := range pool.Endpoints {
			if ep == decoder || !d.canPrefill(ep) {
				continue
			}
			if d.slo {
				if c := d.candidate(ep); c != nil && c.pred.set && (soonest == "" || c.pred.TTFT < soonestTTFT) {
					soonest, soonestPool, soonestTTFT = ep, pool, c.pred.TTFT
				}
			}
			if s := xxh3.HashStringSeed(ep, key); best == "" || s > bestScore {
				best, bestPool, bestScore = ep, pool, s
			}
		}
	}
	if soonest != "" {
		return soonest, soonestPool
	}
	return best, bestPool
}

// worthSplitting weighs a request whose uncached prompt reached minUncachedTokens: it is split when the
// prefiller prefills it and the KV cache reaches the decoder (kvBytesPerToken × tokens ÷ transferGbps) sooner
// than the decoder would prefill it itself — by SLO placement's predictions of both, queues counted, when it
// has them, else by the pools' prefill speeds — or when prefilling it there would stall the decoder's running
// requests past the TPOT target: each running decode waits out the whole prefill, chunk by chunk, which over
// about priorServiceTokens more tokens must fit in what the target leaves beyond a decode step. Without the
// pools' speeds it is split, as the threshold alone says. It also returns the split's expected TTFT (0 when
// unknown).
func (d *decision) worthSplitting(decoder, prefiller string, prefillPool *policies.Pool, uncached int, dg *policies.Disaggregation) (bool, time.Duration) {
	c := d.candidate(decoder)
	prefillTPS := d.snap.Speed(prefillPool).PrefillTokensPerSecond
	if c == nil || c.prefillTPS <= 0 || prefillTPS <= 0 {
		return true, 0
	}
	gbps := dg.TransferGbps
	if gbps <= 0 {
		gbps = policies.DefaultDisaggTransferGbps
	}
	transfer := float64(uncached) * float64(dg.KVBytesPerToken) * 8 / (gbps * 1e9)
	whole := float64(uncached) / c.prefillTPS
	split := float64(uncached)/prefillTPS + transfer
	if d.slo && c.pred.set {
		if p := d.candidate(prefiller); p != nil && p.pred.set {
			whole, split = c.pred.TTFT.Seconds(), p.pred.TTFT.Seconds()+transfer
		}
	}
	ttft := time.Duration(split * float64(time.Second))
	if split < whole {
		return true, ttft
	}
	running := c.running
	if d.p.Engines != nil {
		if m, fresh := d.p.Engines.Metrics(decoder); fresh {
			running = max(running, m.Running)
		}
	}
	tpot := d.targets.TPOT.Seconds()
	if running < 1 || tpot <= 0 {
		return false, 0
	}
	step := fullStepTime(c) * min(1, (running+1)/max(1, float64(c.pool.MaxConcurrency)))
	return float64(uncached)/c.prefillTPS > (tpot-step)*priorServiceTokens, ttft
}

// candidate is the decision's candidate at endpoint ep, with SLO placement's prediction when it made one; nil
// when it is none.
func (d *decision) candidate(ep string) *scored {
	for i := range d.predicted {
		if d.predicted[i].endpoint == ep {
			return &d.predicted[i]
		}
	}
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
