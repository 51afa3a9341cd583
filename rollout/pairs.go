package rollout

import (
	"context"
	"fmt"
	"sync"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
)

// pairTally is one model's judged shadow pairs in one run of its rollout: each arm's summed scores.
type pairTally struct {
	n, inflight, dropped int
	base, cand           float64
}

// pairTallies are the models' tallies; their own lock, so that a judge's answer never waits for a Tick.
type pairTallies struct {
	mu     sync.Mutex
	models map[string]*pairTally
}

// current returns a model's tally, started if there is none.
func (p *pairTallies) current(model string) *pairTally {
	if p.models == nil {
		p.models = map[string]*pairTally{}
	}
	t := p.models[model]
	if t == nil {
		t = &pairTally{}
		p.models[model] = t
	}
	return t
}

// reset starts a model's tally afresh (a new run): judgements still in flight land in the old one.
func (p *pairTallies) reset(model string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.models, model)
}

// read returns a copy of a model's tally.
func (p *pairTallies) read(model string) pairTally {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *p.current(model)
}

// ShadowPair has the plan's judge score a copied request's two answers (shadow.Options.Pairs): while the model
// is shadowing, at most ShadowPairs.MaxConcurrent at once; a pair beyond that is not judged. It never waits.
func (c *Controller) ShadowPair(p director.ShadowPair) {
	snap := c.opts.Policies.Current()
	m, ok := snap.Model(p.Model)
	if !ok {
		return
	}
	plan, ok := snap.Rollout(m)
	if !ok || plan.Eval == nil || plan.Eval.ShadowPairs == nil || c.ShadowShare(p.Model) <= 0 {
		return
	}
	c.pairs.mu.Lock()
	t := c.pairs.current(p.Model)
	if t.inflight >= plan.Eval.ShadowPairs.MaxConcurrent {
		t.dropped++
		c.pairs.mu.Unlock()
		return
	}
	t.inflight++
	c.pairs.mu.Unlock()
	judge := evaluator{client: c.opts.EvalClient}
	go func() {
		base, cand, err := judge.pair(context.Background(), plan.Eval, p)
		c.pairs.mu.Lock()
		defer c.pairs.mu.Unlock()
		t.inflight--
		if err != nil {
			t.dropped++
			c.opts.Logger.Warn("shadow pair not judged", "model", p.Model, "request_id", p.RequestID, "err", err)
			return
		}
		t.n++
		t.base += base
		t.cand += cand
	}()
}

// judgePairs adds the shadow pairs' verdict to a shadow phase's: the phase holds until ShadowPairs.MinPairs
// pairs are judged, and fails when the candidate's mean score is below the baseline's minus the margin.
func (c *Controller) judgePairs(plan *policies.RolloutPlan, v Verdict) Verdict {
	if plan.Eval == nil || plan.Eval.ShadowPairs == nil || v.Result == Fail {
		return v
	}
	t := c.pairs.read(plan.Model.Name)
	sp := plan.Eval.ShadowPairs
	if t.n < sp.MinPairs {
		if v.Result == Pass {
			v.Result, v.Reason = Insufficient, fmt.Sprintf("need %d judged shadow pairs, have %d", sp.MinPairs, t.n)
		}
		return v
	}
	r := EvalReport{Cases: t.n, Candidate: t.cand / float64(t.n), Baseline: t.base / float64(t.n), Margin: plan.Eval.Margin}
	c.opts.Metrics.eval(plan.Model.Name, "shadow", r)
	if !r.Passed() {
		v.Result = Fail
		v.Reason = fmt.Sprintf("shadow pairs: the judge scored the candidate %.3f against the baseline's %.3f over %d pairs (margin %.3f)",
			r.Candidate, r.Baseline, t.n, r.Margin)
	}
	return v
}
