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
	if pd.TTFT+pd.tail > limit(tg.TTFT-waited) {
		return false
	}
	return tg.TPOT == 0 || pd.TPOT == 0 || pd.TPOT <= limit(tg.TPOT)
}

// worthWaiting says whether a request no candidate is predicted to serve in time should wait for one (the
// admission queue) rather than go to the fastest now: the gateway queues, and some candidate would meet the
// TTFT target once its queue drained. A prompt too long for the target even on an idle endpoint is served at
// once: waiting would only make it later.
func (d *decision) worthWaiting(late []scored) bool {
	in, tg, margin := d.in, d.targets, d.routing.SLOMargin
	return in.Queueing && anyIdleWithin(late, tg.TTFT-in.Waited, margin, true)
}

// placeBySLO places a request by goodput, then cost. Every eligible candidate's TTFT, TPOT and cost are
// predicted. Among those predicted to meet the targets, the cheapest (within costTolerance; a held prefix
// makes an endpoint both faster and cheaper) are ordered by affinity and load as without an SLO, the other
// meeting ones follow by cost. When none meets them, the model's fallback takes the request if its when lists
// slo; otherwise, when the gateway queues and an endpoint would serve the request in time once its queue
// drained, the request is reported saturated and waits for one (a request started late misses its target and
// delays those behind it, so the fleet serves fewer within their SLO); otherwise, when the fleet is overloaded,
// it goes where saturated overflow goes (see overloaded); otherwise the fastest predicted go first (see
// fastest). (Overflowing only once even the fastest was predicted past the target itself, not the margin, cost
// bench-fleet 6 % of its goodput to save 2 % of its managed traffic.) Predictions the model does not trust
// (see Trust) are ranked as placement: affinity ranks them; a prompt that starts a group is priced with its
// follow-ups (see Group placement).
//
// all is every candidate of the model: the group bound of new prefixes counts the groups of every endpoint in
// the band's pools, in or out of the load bound, as without an SLO, so that gateway replicas, whose in-flight
// counts differ, still agree on where a new group starts.
func (d *decision) placeBySLO(eligible, all []scored) (Decision, error) {
	p, in := d.p, d.in
	plan := d.planGroup(all)
	d.model = p.pred.predictAll(in.Model.Name, eligible, &d.prompt, d.out, plan, d.targets.Objective, d.now)
	for i := range eligible {
		eligible[i].addRTT()
		eligible[i].harmsLegs = eligible[i].pred.legsLate > 0 && d.prefillsHere(&eligible[i])
	}
	d.predicted = eligible
	nGood := spareLegs(eligible, d.judge(eligible))
	if !d.trustPredictions() {
		// The predictions are not to be relied on: rank as placement: affinity does, in the nearest region; the
		// chosen endpoint still carries its prediction, so that the models learn and trust can return.
		if d.regional {
			eligible, all = nearestOnly(eligible, all, &d.buf.peers)
		}
		return d.decide(d.order(eligible, all, anyMatched(eligible))), nil
	}
	group := plan.followUps > 0
	if group {
		d.groupCosts(eligible, plan)
	}
	rankBySLO(eligible, group)
	if nGood == 0 {
		return d.noneInTime(eligible, all)
	}
	if i, ok := d.sacrifice(eligible, nGood, plan); ok {
		d.sacrificing = true
		p.noteSharing(false)
		eligible[0], eligible[i] = eligible[i], eligible[0]
		return d.decide(eligible), nil
	}
	good := eligible[:nGood]
	nBand := 1
	for nBand < len(good) && good[nBand].region == good[0].region && good[nBand].sloCost(group) <= good[0].sloCost(group)*(1+costTolerance) {
		nBand++
	}
	band := good[:nBand]
	ordered := d.order(band, peersOf(band, all, &d.buf.peers), anyMatched(band))
	if len(ordered) == nBand && &ordered[0] == &eligible[0] {
		return d.decide(eligible), nil // sorted in place: the dearer and the late follow as they are
	}
	return d.decide(append(ordered, eligible[nBand:]...)), nil
}

// rankBySLO sorts judged candidates in place: the meeting ones first, nearest region first, then cheapest
// first (for a new group, by group cost); then the late ones, those that would decode within the TPOT target
// first (see decodesLate), fastest at the tail of their spread first (see atTail).
func rankBySLO(cands []scored, group bool) {
	sortScored(cands, true, func(a, b *scored) int {
		switch {
		case a.meets != b.meets:
			return trueFirst(a.meets)
		case a.meets && a.region != b.region: // the nearest region in time first (see Regions)
			return a.region - b.region
		case a.meets:
			return cmpFloat(a.sloCost(group), b.sloCost(group))
		}
		if la, lb := a.pred.decodesLate(), b.pred.decodesLate(); la != lb {
			return trueFirst(lb)
		}
		return cmpFloat(float64(a.pred.atTail()), float64(b.pred.atTail()))
	})
}

// decodesLate says the request would decode past its TPOT target itself there. Late candidates that would not
// come first: a request predicted late for its first token often makes it (the prediction is judged at the
// tail, within the margin), and then its TPOT decides; the fastest first token on a packed batch loses it.
func (pd *Prediction) decodesLate() bool {
	return pd.tpotLimit > 0 && pd.TPOT > pd.tpotLimit
}

// sloCost is what SLO placement ranks meeting candidates by: the request's cost, or its group's.
func (c *scored) sloCost(group bool) float64 {
	if group {
		return c.grp.costUSD
	}
	return c.pred.CostUSD
}

// trustPredictions says whether the model's predictions may be relied on for these candidates (see Trust, as
// predictAll read it), keeping the metrics.
func (d *decision) trustPredictions() bool {
	p, model := d.p, d.in.Model.Name
	if d.model.trustedChanged {
		p.Metrics.trusted(model, d.model.trusted)
	}
	if !d.model.trusted {
		p.Metrics.fellBack(model, "untrusted")
	}
	return d.model.trusted
}

// judge marks the candidates predicted to meet the request's targets, each within its pool's calibrated
// margin (the policy's margin as it is with the admission queue: see Calibration), and counts them. With the
// admission queue, a request none meets at the tail of its spread is judged again at the mean: it is held in
// the queue only when no endpoint is predicted to serve it in time even so (see Judging at the tail).
func (d *decision) judge(eligible []scored) (nGood int) {
	if d.in.Queueing {
		for i := range eligible {
			eligible[i].pred.factor = 1
		}
	}
	if nGood = d.judgeAt(eligible); nGood > 0 || !d.in.Queueing {
		return nGood
	}
	for i := range eligible {
		eligible[i].pred.tail = 0
	}
	return d.judgeAt(eligible)
}

// spareLegs takes out of the nGood candidates judged to meet the targets those where the request's prefill would
// hold a split request's decode leg past its first-token target (Prediction.legsLate), while another meets them
// without: placed there, the request is in time and the split it overtakes is not. It returns how many still
// meet. Where every meeting candidate would, they stay as judged.
func spareLegs(eligible []scored, nGood int) int {
	harming := 0
	for i := range eligible {
		if eligible[i].meets && eligible[i].harmsLegs {
			harming++
		}
	}
	if harming == 0 || harming == nGood {
		return nGood
	}
	for i := range eligible {
		if eligible[i].meets && eligible[i].harmsLegs {
			eligible[i].meets = false
		}
	}
	return nGood - harming
}

// judgeAt marks and counts the candidates whose predictions, at the tail they carry, meet the targets.
func (d *decision) judgeAt(eligible []scored) (nGood int) {
	in, margin := d.in, d.routing.SLOMargin
	home := prefixHome(eligible, &d.prompt)
	for i := range eligible {
		c := &eligible[i]
		factor := c.pred.factor
		if home > 0 && c.matched == home {
			factor = 1 // see prefixHome
		}
		c.meets = meets(c.pred, d.targets, min(1, margin*factor), in.Waited)
		c.pred.inTime, c.pred.objective, c.pred.margin = c.meets, d.targets.Objective, margin
		c.pred.limit, c.pred.tpotLimit = d.targets.TTFT-in.Waited, d.targets.TPOT
		if c.meets {
			nGood++
		}
	}
	return nGood
}

// prefixHome is the most blocks of the prompt any candidate holds, when a candidate holding the fewest would
// prefill at least half the prompt more (0 otherwise): the candidates holding that many are judged at the
// policy's margin, not the calibrated one (see Calibration). Calibration tightens a pool's margin where
// requests placed in time missed, and a tightened margin moves requests to where predictions have room; but a
// prompt moved off the replica that holds its prefix prefills it again elsewhere, itself a likely miss and load
// the other replica did not plan for. One pool's misses, tightened on, moved the follow-ups of every busy
// group off their prefix, each move a miss that tightened it again (make bench-routing, near saturation, a
// contended gateway: factors 0.27-0.36, 84 % of requests in SLO; judged at the margin, 94 %). Where every
// candidate holds about as much, a move loses little, and calibration applies to all. The factor still learns
// from the requests so placed.
func prefixHome(eligible []scored, pr *prompt) int {
	if len(eligible) == 0 {
		return 0
	}
	most, least := eligible[0].matched, eligible[0].matched
	for _, c := range eligible[1:] {
		most, least = max(most, c.matched), min(least, c.matched)
	}
	if float64(most-least)*pr.engineBlockTokens() < float64(pr.tokens)/2 {
		return 0
	}
	return most
}

// noneInTime decides a request no candidate is predicted to serve in time (late holds them, fastest first):
// the fallback whose when lists slo; the admission queue when waiting can help; where saturated overflow goes
// when the fleet is overloaded; otherwise the fastest.
func (d *decision) noneInTime(late, all []scored) (Decision, error) {
	p, in := d.p, d.in
	if dec, ok := fallbackFor(d.snap, in, policies.WhenSLO); ok {
		p.noteSharing(anyMatched(late))
		return d.managed(dec), nil
	}
	if d.worthWaiting(late) {
		return Decision{}, noCapacity(d.snap, in, true)
	}
	if d.overloaded(late) {
		p.Metrics.fellBack(in.Model.Name, "overload")
		p.pred.noteDecision(in.Model.Name, true, false)
		if dec, ok := fallbackFor(d.snap, in, policies.WhenSaturated); ok {
			p.noteSharing(anyMatched(late))
			return d.managed(dec), nil
		}
		return Decision{}, noCapacity(d.snap, in, true)
	}
	return d.decide(d.fastest(late, all)), nil
}

// lateTolerance is how much slower than the fastest prediction a late candidate may be and still be placed by
// affinity and load among the fastest: when every endpoint is late, the fleet is over its capacity, the
// predictions' differences are mostly the staleness of the engines' metrics, and a request sent away from its
// prefix costs a full prefill that makes everyone later still.
const lateTolerance = 0.25

// fastest orders late candidates (sorted by rankBySLO) when none meets the targets: those within lateTolerance
// of the fastest, as late in TPOT and as harmful to awaited decode legs (spareLegsLate puts one that is not
// first), by affinity and load, then the others as sorted.
func (d *decision) fastest(late, all []scored) []scored {
	spareLegsLate(late)
	n := 1
	for n < len(late) && late[n].pred.decodesLate() == late[0].pred.decodesLate() &&
		late[n].harmsLegs == late[0].harmsLegs &&
		float64(late[n].pred.atTail()) <= float64(late[0].pred.atTail())*(1+lateTolerance) {
		n++
	}
	head := late[:n]
	ordered := d.order(head, peersOf(head, all, &d.buf.peers), anyMatched(head))
	if len(ordered) == n && &ordered[0] == &late[0] {
		return late // sorted in place
	}
	return append(ordered, late[n:]...)
}

// overloaded says the model's fleet is over its capacity: the request is predicted past its targets themselves
// (not only the margin) on every candidate — its first token past the TTFT target, or its tokens past the TPOT
// target (late is ranked so, see rankBySLO) — and not for its own sake (an idle endpoint would start it in
// time, and, when it decodes late, decode it in time alone: a TPOT target the model's hardware cannot meet is
// no overload) but for their backlogs and batches; and either some endpoints are saturated (their queues at
// routing.maxWaiting) or the share of recent decisions that found every endpoint too busy is past the tier's
// error budget (1 − objective) and past minPressure (one busy moment in pressureWindow decisions is not an
// overload). Serving the request anyway only deepens the backlogs every later request waits behind, or slows
// every decode of the batch it joins, until the whole fleet serves late; it goes where saturated overflow goes
// instead — the fallback whose when lists saturated, or a 429 with retry — as it would once every endpoint
// saturated. (Judged by TTFT alone, bench-pd's fixed split served 47 % of requests in time at 32 chat requests a
// second, its decoders' batches past the TPOT target; refusing those predicted to decode late, 85 %.) A lone busy
// moment at moderate load, within the error budget, is served by the fastest as before.
func (d *decision) overloaded(late []scored) bool {
	limit := d.targets.TTFT - d.in.Waited
	d.busy = len(late) > 0 && anyIdleWithin(late, limit, 1, false) &&
		(late[0].pred.TTFT > limit || late[0].pred.decodesLate() && anyIdleDecodesWithin(late, d.targets.TPOT))
	return d.busy && (d.saturated > 0 || d.model.pressure > max(1-d.targets.Objective, minPressure))
}

// legsTolerance is how much slower than the fastest a late candidate may be and still take a request the fastest
// would prefill past an awaited decode leg's first-token target (Prediction.legsLate): the leg is a request lost;
// a long prompt moved to a replica much slower to prefill it holds that replica's waiting requests and running
// decodes as much longer (make bench-pd's family: on one H200 and two L40S pairs at 36 chat requests a second, past
// their capacity, the per-request choice served 2.5 % fewer requests in time when long prompts were moved off
// the H200 whatever the cost).
const legsTolerance = 1.0

// spareLegsLate moves first, keeping their order, the late candidates (sorted by rankBySLO) as late in TPOT as
// the fastest and close to it that would make no awaited decode leg late (scored.harmsLegs): within
// legsTolerance of it when it would, within lateTolerance (fastest's band) when it would not.
func spareLegsLate(late []scored) {
	if len(late) == 0 {
		return
	}
	tolerance := lateTolerance
	if late[0].harmsLegs {
		tolerance = legsTolerance
	}
	m, harming := 1, late[0].harmsLegs
	for m < len(late) && late[m].pred.decodesLate() == late[0].pred.decodesLate() &&
		float64(late[m].pred.atTail()) <= float64(late[0].pred.atTail())*(1+tolerance) {
		harming = harming || late[m].harmsLegs
		m++
	}
	if !harming {
		return
	}
	slices.SortStableFunc(late[:m], func(a, b scored) int {
		if a.harmsLegs == b.harmsLegs {
			return 0
		}
		return trueFirst(!a.harmsLegs)
	})
}

// peersOf is every candidate of all in the pools of cands, for placeNew's group bound: all itself when they
// share one pool with every candidate (the usual case, which costs nothing); otherwise a list in buf.
func peersOf(cands, all []scored, buf *[]scored) []scored {
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
	peers := (*buf)[:0]
	for _, c := range all {
		if in(c.pool) {
			peers = append(peers, c)
		}
	}
	*buf = peers
	return peers
}

// managed is a decision for the model's fallback with its predicted TTFT and cost.
func (d *decision) managed(dec Decision) Decision {
	f, in, pr := dec.Fallback, d.in, &d.prompt
	dec.Adapter = in.Adapter
	dec.EstimatedPromptTokens = pr.estimated
	dec.Predicted = Prediction{TTFT: d.p.pred.managedTTFT(contract.FallbackClusterName(in.Model.Name, f.Name)),
		CostUSD: (float64(pr.tokens)*f.Pricing.InputPerMTok + d.out*f.Pricing.OutputPerMTok) / 1e6, set: true}
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
