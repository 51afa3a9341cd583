package picker

import (
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/policies"
)

// disaggregate names a prefill endpoint for a request worth splitting (policies.Disaggregation,
// docs/disaggregation.md): one that leaves at least minUncachedTokens of its prompt to prefill after the prefix
// the decode endpoint holds, and that the split serves sooner or for less in time, or whose prefill would stall
// the decoder's running decodes more than the prefiller's (worthSplitting). The prefiller is a replica of a
// prefill pool (or, when none can take it, of a pool that does both), other than the decode endpoint, with fresh
// metrics and room in its queue (prefiller). Without one the request runs whole on the decode endpoint.
func (d *decision) disaggregate(dec *Decision) {
	dg := d.in.Model.Disaggregation
	if dg == nil || dec.Fallback != nil || dec.Pool == nil || len(dec.Endpoints) == 0 || len(d.prompt.hashes) == 0 {
		return
	}
	uncached := dec.EstimatedPromptTokens - dec.ExpectedCachedTokens
	if uncached < minUncached(dg) {
		return
	}
	if d.slo && dec.Predicted.set {
		d.predictPrefillers(dec.Pool.Region)
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
		d.creditPrefiller(ep)
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

// minUncached is the uncached prompt tokens from which a request may be split (the policy's floor).
func minUncached(dg *policies.Disaggregation) int {
	if dg.MinUncachedTokens == 0 {
		return policies.DefaultDisaggMinUncachedTokens
	}
	return dg.MinUncachedTokens
}

// prefillsHere says whether the request, placed at candidate c, would mostly prefill there, so that what its
// prefill does to the decode legs awaited there (Prediction.legsLate) counts in its placement: not on a replica of
// a decode pool, which takes a request whole only when a split does not pay (weighing the legs there moved long
// prompts, split after all, to slower decoders: make bench-pd's prefill-only row served 74.5 % of requests in
// time at 36 chat requests a second, 77.1 % without), nor when split: threshold splits it (its uncached prompt,
// as disaggregate estimates it, past the floor; it runs whole after all, the legs unweighed, when no prefiller
// can take it). Where it would prefill a split's prefill leg, the legs there count as they are (prefiller,
// worthSplitting).
func (d *decision) prefillsHere(c *scored) bool {
	dg := d.in.Model.Disaggregation
	if dg == nil {
		return true
	}
	return c.pool.Role != policies.RoleDecode &&
		(dg.Split != policies.SplitPastThreshold || int(c.pred.uncached*d.prompt.scale) < minUncached(dg))
}

// predictPrefillers predicts, under SLO placement, a prefill leg on every replica of the model's prefill-only
// pools in the decoder's region that may take one (canPrefill). The candidates stage lists none of them, as
// they take no whole request; without this the prefiller would be chosen, and the split weighed, by the pools'
// speeds alone, blind to their queues and to the prefixes their caches hold. Each is read as a candidate is
// (its engine's queue, running batch and KV cache, this gateway's sends since) and predicted as a whole
// request is, for a leg of one output token.
func (d *decision) predictPrefillers(region string) {
	p := d.p
	cands := d.buf.prefill[:0]
	for i := range d.in.Model.Pools {
		pool := &d.in.Model.Pools[i]
		if pool.Role != policies.RolePrefill || pool.Region != region || d.in.Tenant != nil && !d.snap.PoolAllowed(d.in.Tenant, pool) {
			continue
		}
		speed := d.snap.Speed(pool)
		for _, ep := range pool.Endpoints {
			if !d.canPrefill(ep) {
				continue
			}
			c := p.newScored(pool, speed, ep)
			c.since = float64(c.own) // without engine metrics: this gateway's own requests are the queue
			if p.Engines != nil {
				m, _ := p.Engines.Metrics(ep) // fresh: canPrefill says so
				c.queue, c.capacity = int64(m.Waiting), m.NumBlocks
				c.readForSLO(m, p.InFlight.SinceReading(ep, m.At))
			}
			c.matched = p.Index.Match(ep, d.prompt.hashes)
			cands = append(cands, c)
		}
	}
	p.pred.predictPrefill(cands, &d.prompt, d.targets.Objective, d.now)
	d.buf.prefill, d.prefillers = cands, cands
}

// creditPrefiller records the prompt in the index at its prefiller, whose prefix cache now holds it: the next
// prompt of its prefix is predicted to prefill there mostly cached.
func (d *decision) creditPrefiller(ep string) {
	capacity := d.p.IndexBlocks
	if c := d.candidate(ep); c != nil && c.capacity > 0 {
		capacity = int(float64(c.capacity) * d.prompt.scale)
	}
	d.p.Index.Credit(ep, d.prompt.hashes, capacity)
}

// predictSplit books a split request's prefill, in SLO placement's books, at its prefiller too: the prefiller's
// queue holds the prompt until its first token passes (Prefilled). The decoder keeps it as well, though it
// prefills only the last token, on the KV cache it pulls: a prefill the decoder will not do, which keeps its
// predicted TTFT up (for a long prompt, past a chat target) until the split's first token, as for a whole
// request; it does not count in the decoder's prefill share (the TPOT model's). That is deliberate. Released at
// once, a decoder looked idle until the split's decode leg joined its batch, drew whole requests whose prefills
// slowed every decode there, and was packed past its TPOT target where prefill capacity was scarce (make
// bench-pd's family of fleets, BENCHMARKS.md); counting the decode legs awaited in the decoder's batch instead
// did not stand in for it (docs/disaggregation.md). The TTFT expected of the split is the prefiller's and the
// transfer, or the decoder's queue (worthSplitting).
func (d *decision) predictSplit(dec *Decision, ttft time.Duration) {
	legAt := d.now.Add(ttft)
	legBy := d.now.Add(time.Duration(float64(d.targets.TTFT-d.in.Waited) * d.routing.SLOMargin))
	if ttft <= 0 || d.targets.TTFT <= 0 {
		legAt, legBy = time.Time{}, time.Time{}
	}
	d.p.pred.prefilledRemotely(dec.Endpoints[0], dec.Predicted, legAt, legBy)
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
// queue and cached prefix counted, among those that would make no awaited decode leg late if any
// (Prediction.legsLate); otherwise by rendezvous on the prompt's first block: a prefix keeps its
// prefiller, whose cache holds it, and prefixes spread over the pool. Only pools of the decoder's region
// prefill for it: a KV cache does not cross regions.
func (d *decision) prefiller(role, decoder, region string) (string, *policies.Pool) {
	key := d.prompt.hashes[0]
	var best, soonest string
	var bestPool, soonestPool *policies.Pool
	var bestScore uint64
	var soonestTTFT time.Duration
	var soonestLate bool
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
				if c := d.candidate(ep); c != nil && c.pred.set {
					late := c.pred.legsLate > 0
					if soonest == "" || late != soonestLate && !late || late == soonestLate && c.pred.TTFT < soonestTTFT {
						soonest, soonestPool, soonestTTFT, soonestLate = ep, pool, c.pred.TTFT, late
					}
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

// worthSplitting weighs a request whose uncached prompt reached minUncachedTokens. With the policy's split:
// threshold, or without the pools' speeds, it is split as the threshold alone says. Under SLO placement, with
// both endpoints predicted, it weighs first what the prefill does to the running decodes where it runs
// (stallHarm: with chunked prefill they share its steps): it is split when prefilling it whole would push the
// decoder's decodes further past the TPOT target than the prefill leg pushes the prefiller's (none on a prefill
// pool), and the split still meets the TTFT target; it runs whole when the split would do the more harm. So with
// the awaited decode legs its prefill would hold past their targets (Prediction.legsLate) at either end. Else it
// is split when the split serves it sooner — the prefiller's TTFT and the KV transfer (kvBytesPerToken × tokens ÷
// transferGbps), or the decoder's queue when its decode leg would wait longer for it (decodeLeg), against the
// decoder's TTFT, by the pools' prefill speeds without predictions — or when it meets the request's targets and
// its prefill costs less on the prefiller's hardware (cheaperInTime); or, failing all, with predictions or
// without, when prefilling it would stall the decoder's running requests past the TPOT target: each running
// decode waits out the whole prefill, chunk by chunk, which over about priorServiceTokens more tokens must fit in
// what the target leaves beyond a decode step. The decoder's queue counts as booked, other splits' bookings
// included (predictSplit). It also returns the split's expected TTFT (0 when unknown).
func (d *decision) worthSplitting(decoder, prefiller string, prefillPool *policies.Pool, uncached int, dg *policies.Disaggregation) (bool, time.Duration) {
	c := d.candidate(decoder)
	prefillTPS := d.snap.Speed(prefillPool).PrefillTokensPerSecond
	if c == nil || c.prefillTPS <= 0 || prefillTPS <= 0 {
		return true, 0
	}
	transfer := transferTime(uncached, dg).Seconds()
	whole := float64(uncached) / c.prefillTPS
	split := float64(uncached)/prefillTPS + transfer
	var pf *scored
	if d.slo && c.pred.set {
		if pf = d.candidate(prefiller); pf != nil && pf.pred.set {
			whole = c.pred.TTFT.Seconds()
			split = max(pf.pred.TTFT.Seconds()+transfer, c.pred.decodeLeg.Seconds())
		} else {
			pf = nil
		}
	}
	ttft := time.Duration(split * float64(time.Second))
	if dg.Split == policies.SplitPastThreshold {
		return true, ttft
	}
	running := d.runningOf(decoder, c)
	if pf != nil && c.pred.tpotStep > 0 {
		onDecoder := d.stallHarm(c, c.pred.uncached, running)
		onPrefiller := 0.0
		if prefillPool.Role != policies.RolePrefill {
			onPrefiller = d.stallHarm(pf, pf.pred.uncached, d.runningOf(prefiller, pf))
		}
		if onDecoder > onPrefiller && d.splitInTime(pf, ttft) {
			return true, ttft
		}
		if onPrefiller > onDecoder {
			return false, 0
		}
	}
	if pf != nil && pf.pred.legsLate != c.pred.legsLate {
		if pf.pred.legsLate > c.pred.legsLate {
			return false, 0
		}
		if d.splitInTime(pf, ttft) {
			return true, ttft
		}
	}
	if split < whole || pf != nil && d.cheaperInTime(c, pf, uncached, ttft) {
		return true, ttft
	}
	tpot := d.targets.TPOT.Seconds()
	if running < 1 || tpot <= 0 {
		return false, 0
	}
	step := fullStepTime(c) * min(1, (running+1)/max(1, float64(c.pool.MaxConcurrency)))
	return float64(uncached)/c.prefillTPS > (tpot-step)*priorServiceTokens, ttft
}

// splitInTime says whether a split whose TTFT is predicted at ttft meets the TTFT target within the policy's
// margin, at the prefiller's tail: the prefill leg is the part of it whose spread the picker knows.
func (d *decision) splitInTime(pf *scored, ttft time.Duration) bool {
	sp := pf.pred
	sp.TTFT, sp.TPOT = ttft, 0
	return meets(sp, d.targets, d.routing.SLOMargin, d.in.Waited)
}

// runningOf is endpoint ep's running batch: its candidate c's, or its engine's fresh reading when larger.
func (d *decision) runningOf(ep string, c *scored) float64 {
	running := c.running
	if d.p.Engines != nil {
		if m, fresh := d.p.Engines.Metrics(ep); fresh {
			running = max(running, m.Running)
		}
	}
	return running
}

// stallHarm is how far prefilling tokens more on candidate c pushes its running decodes past the TPOT target's
// margin: each of running decodes is predicted at c's decode step over 1 − its prefill share, without and with
// the prefill added to the share (tpotWithPrefill), and counts by how much more it is past the margin than
// before (0 when it stays within).
func (d *decision) stallHarm(c *scored, tokens, running float64) float64 {
	limit := d.targets.TPOT.Seconds() * d.routing.SLOMargin
	if limit <= 0 || running < 1 || c.pred.tpotStep <= 0 {
		return 0
	}
	before := tpotWithPrefill(c.pred, 0, c.speed.PrefillTokensPerSecond).Seconds()
	after := tpotWithPrefill(c.pred, tokens, c.speed.PrefillTokensPerSecond).Seconds()
	return running * (max(0, after-limit) - max(0, before-limit))
}

// cheaperInTime says whether a split whose TTFT is predicted at ttft (see worthSplitting) meets the request's
// TTFT target (splitInTime), and either prefills for less on the prefiller (its class's price for the tokens its
// cache does not hold) than on the decoder (for the uncached tokens), or spares a decoder whose predicted TPOT is
// already past the target's margin: the request is in time either way, and the split is cheaper, or keeps the
// prefill out of the steps the decoder's running decodes share. The split itself is not judged on TPOT, which is
// the decoder's either way.
func (d *decision) cheaperInTime(dc, pf *scored, uncached int, ttft time.Duration) bool {
	if !d.splitInTime(pf, ttft) {
		return false
	}
	if d.targets.TPOT > 0 && float64(dc.pred.TPOT) > float64(d.targets.TPOT)*d.routing.SLOMargin {
		return true // a decoder past its TPOT margin is spared the prefill, whatever it costs
	}
	onPrefiller := pf.speed.CostPerHour * pf.pred.uncached / max(pf.speed.PrefillTokensPerSecond, 1)
	onDecoder := dc.speed.CostPerHour * float64(uncached) / max(dc.speed.PrefillTokensPerSecond, 1)
	return onPrefiller < onDecoder
}

// transferTime is how long the KV cache of uncached prompt tokens takes from the prefiller to the decoder:
// kvBytesPerToken × tokens ÷ the pools' link (transferGbps).
func transferTime(uncached int, dg *policies.Disaggregation) time.Duration {
	gbps := dg.TransferGbps
	if gbps <= 0 {
		gbps = policies.DefaultDisaggTransferGbps
	}
	return time.Duration(float64(uncached) * float64(dg.KVBytesPerToken) * 8 / (gbps * 1e9) * float64(time.Second))
}

// candidate is the decision's candidate at endpoint ep, with SLO placement's prediction when it made one; nil
// when it is none.
func (d *decision) candidate(ep string) *scored {
	for i := range d.predicted {
		if d.predicted[i].endpoint == ep {
			return &d.predicted[i]
		}
	}
	for i := range d.prefillers {
		if d.prefillers[i].endpoint == ep {
			return &d.prefillers[i]
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
