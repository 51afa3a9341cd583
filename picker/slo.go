package picker

import (
	"slices"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// costTolerance is how much dearer than the cheapest SLO-meeting candidate another may be and still be
// placed by affinity and load among the cheapest: replicas of one pool differ only by what their caches
// hold, and prices in the policy are not exact to the percent.
const costTolerance = 0.10

// defaultOutputTokens is the output a request that sets no max_tokens is costed for.
const defaultOutputTokens = 256

// sloTargets returns the request's targets and whether SLO placement applies: routing.placement slo and a
// TTFT target for the tenant's tier and the model.
func sloTargets(snap *policies.Snapshot, in Input) (policies.Targets, bool) {
	if snap.Routing().Placement != policies.PlacementSLO {
		return policies.Targets{}, false
	}
	tg := snap.SLO(in.Tenant, in.Model)
	return tg, tg.Set && tg.TTFT > 0
}

// meets says whether a prediction is within targets, each scaled by margin, for a request that has already
// waited (what it waited is taken from the TTFT target); an unpredicted TPOT passes.
func meets(pd Prediction, tg policies.Targets, margin float64, waited time.Duration) bool {
	limit := func(d time.Duration) time.Duration { return time.Duration(float64(d) * margin) }
	if pd.TTFT > limit(tg.TTFT-waited) {
		return false
	}
	return tg.TPOT == 0 || pd.TPOT == 0 || pd.TPOT <= limit(tg.TPOT)
}

// worthWaiting says whether a request no candidate is predicted to serve in time should wait for one (the
// admission queue) rather than go to the fastest now: the gateway queues, and some candidate would meet the
// TTFT target once its queue drained. A prompt too long for the target even on an idle endpoint is served at
// once: waiting would only make it later.
func (p *Affinity) worthWaiting(in Input, late []scored, tg policies.Targets, margin float64) bool {
	return in.Queueing && p.pred.anyIdleWithin(late, time.Duration(float64(tg.TTFT-in.Waited)*margin))
}

// placeBySLO places a request by goodput, then cost. Every eligible candidate's TTFT, TPOT and cost are
// predicted. Among those predicted to meet the targets, the cheapest (within costTolerance; a held prefix
// makes an endpoint both faster and cheaper) are ordered by affinity and load as without an SLO, the other
// meeting ones follow by cost. When none meets them, the model's fallback takes the request if its when lists
// slo; otherwise, when the gateway queues and an endpoint would serve the request in time once its queue
// drained, the request is reported saturated and waits for one (a request started late misses its target and
// delays those behind it, so the fleet serves fewer within their SLO); otherwise the fastest predicted go
// first (see fastest). (Overflowing only once even the fastest was
// predicted past the target itself, not the margin, cost bench-fleet 6 % of its goodput to save 2 % of its
// managed traffic.)
//
// all is every candidate of the model: the group bound of new prefixes counts the groups of every endpoint in
// the band's pools, in or out of the load bound, as without an SLO, so that gateway replicas, whose in-flight
// counts differ, still agree on where a new group starts.
func (p *Affinity) placeBySLO(snap *policies.Snapshot, in Input, eligible, all []scored, pr prompt, w weights, tg policies.Targets) (Decision, error) {
	out := float64(defaultOutputTokens)
	if in.Request != nil && in.Request.MaxTokens > 0 {
		out = float64(in.Request.MaxTokens)
	}
	p.pred.predictAll(eligible, pr, out)
	margin := snap.Routing().SLOMargin
	nGood := 0
	for i := range eligible {
		c := &eligible[i]
		c.s.TTFT, c.s.TPOT, c.s.CostUSD = c.pred.TTFT, c.pred.TPOT, c.pred.CostUSD
		c.s.MeetsSLO = meets(c.pred, tg, margin, in.Waited)
		if c.s.MeetsSLO {
			nGood++
		}
	}
	// In place: the meeting candidates first, cheapest first; then the late ones, fastest first.
	slices.SortStableFunc(eligible, func(a, b scored) int {
		switch {
		case a.s.MeetsSLO != b.s.MeetsSLO:
			if a.s.MeetsSLO {
				return -1
			}
			return 1
		case a.s.MeetsSLO:
			return cmpFloat(a.pred.CostUSD, b.pred.CostUSD)
		}
		return cmpFloat(float64(a.pred.TTFT), float64(b.pred.TTFT))
	})
	good, late := eligible[:nGood], eligible[nGood:]
	if nGood == 0 {
		if dec, ok := fallbackFor(in.Model, in.Adapter, policies.WhenSLO); ok {
			p.noteSharing(anyMatched(eligible))
			return p.managedDecision(dec, in, pr, out), nil
		}
		if p.worthWaiting(in, late, tg, margin) {
			return Decision{}, &NoCapacity{Model: in.Model.Name, Saturated: true}
		}
		return p.decide(snap, in, p.fastest(late, all, pr, w), pr), nil
	}
	nBand := 1
	for nBand < len(good) && good[nBand].pred.CostUSD <= good[0].pred.CostUSD*(1+costTolerance) {
		nBand++
	}
	band := good[:nBand]
	ordered := p.order(band, peersOf(band, all), pr, anyMatched(band), w)
	if len(ordered) == nBand && &ordered[0] == &eligible[0] {
		return p.decide(snap, in, eligible, pr), nil // sorted in place: the dearer and the late follow as they are
	}
	return p.decide(snap, in, append(ordered, eligible[nBand:]...), pr), nil
}

// lateTolerance is how much slower than the fastest prediction a late candidate may be and still be placed by
// affinity and load among the fastest: when every endpoint is late, the fleet is over its capacity, the
// predictions' differences are mostly the staleness of the engines' metrics, and a request sent away from its
// prefix costs a full prefill that makes everyone later still.
const lateTolerance = 0.25

// fastest orders late candidates (sorted by predicted TTFT) when none meets the targets: those within
// lateTolerance of the fastest by affinity and load, then the others by predicted TTFT.
func (p *Affinity) fastest(late, all []scored, pr prompt, w weights) []scored {
	n := 1
	for n < len(late) && float64(late[n].pred.TTFT) <= float64(late[0].pred.TTFT)*(1+lateTolerance) {
		n++
	}
	head := late[:n]
	ordered := p.order(head, peersOf(head, all), pr, anyMatched(head), w)
	if len(ordered) == n && &ordered[0] == &late[0] {
		return late // sorted in place
	}
	return append(ordered, late[n:]...)
}

// peersOf is every candidate of all in the pools of cands, for placeNew's group bound: all itself when they
// share one pool with every candidate (the usual case, which costs nothing).
func peersOf(cands, all []scored) []scored {
	in := func(pool *policies.Pool) bool {
		for i := range cands {
			if cands[i].pool == pool {
				return true
			}
		}
		return false
	}
	every := true
	for i := range all {
		every = every && in(all[i].pool)
	}
	if every {
		return all
	}
	peers := make([]scored, 0, len(all))
	for _, c := range all {
		if in(c.pool) {
			peers = append(peers, c)
		}
	}
	return peers
}

// managedDecision is a decision for the model's fallback with its predicted TTFT and cost.
func (p *Affinity) managedDecision(dec Decision, in Input, pr prompt, out float64) Decision {
	f := dec.Fallback
	dec.Adapter = in.Adapter
	dec.EstimatedPromptTokens = pr.estimated
	dec.Predicted = Prediction{TTFT: p.pred.managedTTFT(contract.FallbackClusterName(in.Model.Name, f.Name)),
		CostUSD: (float64(pr.tokens)*f.Pricing.InputPerMTok + out*f.Pricing.OutputPerMTok) / 1e6, set: true}
	return dec
}

func anyMatched(cands []scored) bool {
	for i := range cands {
		if cands[i].matched > 0 {
			return true
		}
	}
	return false
}

// ObserveTiming implements TimingObserver: the chosen endpoint's model (or the fallback's) is fitted to the
// measured time from routing to the first token and time per output token. A request Envoy retried elsewhere
// teaches nothing: it was predicted for another endpoint.
func (p *Affinity) ObserveTiming(model string, d Decision, ttft, tpot time.Duration) {
	if !d.Predicted.set {
		return
	}
	if d.Fallback != nil {
		p.pred.observeManaged(contract.FallbackClusterName(model, d.Fallback.Name), ttft)
		return
	}
	if len(d.Endpoints) == 0 || (d.ServedBy != "" && d.ServedBy != d.Endpoints[0]) {
		return
	}
	p.pred.observe(d.Endpoints[0], d.Predicted, ttft, tpot)
}
