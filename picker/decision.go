package picker

import (
	"time"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker/scorers"
	"github.com/infergate/infergate/policies"
)

// decision is one request's way through the picker's pipeline (see Affinity): what it is about, the settings
// in force for it, and what each stage leaves for the next. It lives for one Pick; everything that outlives the
// request is on the Affinity.
type decision struct {
	p    *Affinity
	snap *policies.Snapshot
	in   Input

	routing policies.Routing
	table   []scorers.Scorer
	weights *[scorers.Max]float64 // the table's weights, in its order (resolved once per snapshot)
	// targets are the request's SLO; slo says SLO placement applies (routing.placement slo and a TTFT target).
	targets policies.Targets
	slo     bool
	// out is the output SLO placement prices: the director's bound, as admission reserves it; now is when
	// it decides, on the picker's clock.
	out float64
	now time.Time

	// Left by the stages: every candidate and what the candidates stage left out (candidates), the hashed
	// prompt.
	all                    []scored
	saturated, unavailable int
	tooLong                int  // candidates whose KV cache cannot hold the request at all (bound)
	regional               bool // the candidates are in more than one region (see Regions)
	prompt                 prompt
	hashed                 bool
	// model is what SLO placement read of its model's learning; busy says every endpoint was too busy to serve
	// the request in time, sacrificing that its group's first request is placed late (both noted once decided).
	model             modelState
	busy, sacrificing bool
	// predicted are the candidates SLO placement predicted for, prefillers the replicas of prefill-only pools
	// it predicted a prefill leg for (the split reads their predictions).
	predicted, prefillers []scored
	// buf holds the candidate lists; it goes back to the picker's pool at release.
	buf *candidateLists
}

// candidateLists are a decision's candidate lists, kept between decisions: a candidate's record is large (scored) and a
// decision makes up to four lists of them, which cost more to allocate than the rest of a decision.
type candidateLists struct {
	all, bounded, peers, arm, prefill []scored
}

// reset drops the lists' references to pools and endpoints, keeping their room.
func (s *candidateLists) reset() {
	clear(s.all)
	clear(s.bounded)
	clear(s.peers)
	clear(s.arm)
	clear(s.prefill)
	s.all, s.bounded, s.peers, s.arm, s.prefill = s.all[:0], s.bounded[:0], s.peers[:0], s.arm[:0], s.prefill[:0]
}

// newDecision gathers what a decision needs before its first stage.
func (p *Affinity) newDecision(snap *policies.Snapshot, in Input) decision {
	d := decision{p: p, snap: snap, in: in, routing: snap.Routing(), table: p.table()}
	if b, ok := p.lists.Get().(*candidateLists); ok {
		d.buf = b
	} else {
		d.buf = &candidateLists{}
	}
	d.all = d.buf.all
	if len(d.table) > scorers.Max {
		d.table = d.table[:scorers.Max]
	}
	d.weights = p.weightsFor(snap, d.table)
	d.targets, d.slo = sloTargets(snap, in)
	if d.slo {
		d.out, d.now = float64(outputTokens(snap, in)), p.now()
	}
	return d
}

// outputTokens is the output a request is priced for: the director's bound, or the same bound computed here
// for a caller that did not pass one.
func outputTokens(snap *policies.Snapshot, in Input) int64 {
	if in.OutputTokens > 0 || in.Request == nil {
		return in.OutputTokens
	}
	r := in.Request
	bound, _, _ := snap.OutputBound(in.Model, r.Endpoint != openai.EndpointEmbeddings, r.MaxTokens, int64(r.EstimatePromptTokens()))
	return bound
}

// run takes the decision through the stages: candidates, then (per rollout arm, when the model has one)
// bound, score, place and decide.
func (d *decision) run() (Decision, error) {
	engineBlock := d.candidates()
	if len(d.all) == 0 {
		return d.overflow(0)
	}
	d.hashPrompt(engineBlock)
	var dec Decision
	var err error
	if d.in.Split != nil {
		dec, err = d.pickArm()
	} else {
		dec, err = d.place(d.all)
	}
	if err == nil {
		d.disaggregate(&dec)
		d.publishPrefill(&dec)
	}
	return dec, err
}

// place decides among cands (every candidate, or one rollout arm's): bound, score, then order by score or,
// under SLO placement, by predicted timing and cost; the first wins.
func (d *decision) place(cands []scored) (Decision, error) {
	if d.regional && !d.slo {
		return d.placeNearest(cands)
	}
	eligible, anyMatch, kvFull := d.bound(cands)
	if len(eligible) == 0 {
		return d.overflow(kvFull)
	}
	d.score(eligible, cands)
	if d.slo {
		return d.placeBySLO(eligible, cands)
	}
	return d.decide(d.order(eligible, cands, anyMatch)), nil
}

// overflow is the decision when no candidate can take the request (kvFull more were left out for a full KV
// cache): see overflow.
func (d *decision) overflow(kvFull int) (Decision, error) {
	return overflow(d.snap, d.in, d.saturated+kvFull, d.unavailable+d.tooLong)
}

// pickArm places a rolled-out model's request on its arm's pools. A candidate arm that cannot take it (no
// endpoint, or all full so that placement would overflow) leaves it to the baseline: the candidate's share is
// a ceiling, never a reason to refuse or to pay the managed API.
func (d *decision) pickArm() (Decision, error) {
	sp := d.in.Split
	group := sp.Conversation
	if group == 0 && len(d.prompt.hashes) > 0 {
		group = GroupKey(d.prompt.hashes)
	}
	if group == 0 {
		group = sp.Ungrouped
	}
	arm := sp.arm(d.in.Model.Name, group)
	if kept := sp.inArmOnly(d.all, arm, &d.buf.arm); len(kept) > 0 {
		dec, err := d.place(kept)
		if arm == ArmBaseline || sp.Force != "" || (err == nil && dec.Fallback == nil) {
			return sp.annotate(dec, arm), err
		}
	} else if sp.Force == ArmBaseline {
		return d.overflow(0)
	}
	base := sp.inArmOnly(d.all, ArmBaseline, &d.buf.arm)
	if len(base) == 0 {
		return d.overflow(0)
	}
	dec, err := d.place(base)
	return sp.annotate(dec, ArmBaseline), err
}

// release gives the prompt's hash buffer back (through a pointer of its own, so that the decision itself stays
// on the stack).
func (d *decision) release() {
	if d.hashed {
		buf := d.prompt.hashes
		d.p.pool.Put(&buf)
	}
	if d.buf != nil {
		d.buf.all = d.all // the room candidates grew it to
		d.buf.reset()
		d.p.lists.Put(d.buf)
	}
}
