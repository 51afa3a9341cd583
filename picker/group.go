package picker

import (
	"math"
	"time"
)

// Group placement. A prompt whose prefix no endpoint holds starts a group: the requests that will share its
// prefix follow it to the endpoint it lands on, by affinity. Judged alone, its first, uncached request goes
// where it meets its target at the lowest cost, and a cheap class that meets the target only for cached
// prompts never gets a group. So under SLO placement a new group is judged by its expected life:
//
//	group cost = cost of the first request + E[follow-ups] × cost of a follow-up
//
// where E[follow-ups] = s ÷ (1 − s), s being the share of recent prompts that matched a held prefix (a
// workload whose groups have G requests has s = (G − 1) ÷ G), and a follow-up is the prompt with its shared
// part — φ, the learnt share of a matching prompt's tokens that were held — cached: its TTFT and cost are
// predicted with (1 − φ) of the prompt uncached. The meeting candidates are ranked by group cost instead of the
// first request's; and a candidate where the first request is late for the class's speed (late even were the
// endpoint idle, not for a queue its follow-ups would wait in too) but its follow-ups would meet their
// target may take the group when its group cost is below the best meeting candidate's by more than
// costTolerance — a first request served late to buy the group's later requests meeting theirs more cheaply —
// while such sacrificed first requests stay within the error budget that calibration leaves (1 −
// calibrationBudget of 1 − objective, over about sacrificeWindow decisions), and no later than
// maxSacrificeLateness × the target.
const (
	maxFollowUps         = 63
	sacrificeWindow      = 1024
	maxSacrificeLateness = 2.0
	sharedWindow         = 32 // decisions φ averages over
)

// groupFigures are a candidate's figures for a new group (debugScores shows them).
type groupFigures struct {
	followTTFT  time.Duration
	followMeets bool
	costUSD     float64
}

// groupPlan is what a decision knows of the group its prompt starts: the expected follow-ups and the tokens
// each leaves uncached. followUps 0: the prompt starts no group worth planning.
type groupPlan struct {
	followUps      float64
	followUncached float64 // of the prompt's tokens
}

// planGroup says whether the prompt starts a group — it has prefix blocks, no candidate holds any of them,
// and prompts have been seen to share — and what its follow-ups are expected to be.
func (d *decision) planGroup(all []scored) groupPlan {
	if len(d.prompt.hashes) == 0 || anyMatched(all) {
		return groupPlan{}
	}
	phi := math.Float64frombits(d.p.shared.Load())
	s := d.p.sharingRate()
	if phi <= 0 || s <= 0 {
		return groupPlan{}
	}
	return groupPlan{followUps: min(maxFollowUps, s/max(1-s, 1.0/(maxFollowUps+1))), followUncached: float64(d.prompt.tokens) * (1 - phi)}
}

// sharingRate is the share of recent prompts that matched a held prefix, as noteSharing keeps it, without
// counting this one.
func (p *Affinity) sharingRate() float64 {
	if b := p.sharing.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 0
}

// noteShared learns φ from a prompt placed where some of it was held: the share of its tokens that were.
func (p *Affinity) noteShared(matchedTokens, promptTokens float64) {
	if matchedTokens <= 0 || promptTokens <= 0 {
		return
	}
	sample := min(1, matchedTokens/promptTokens)
	updateFloat(&p.shared, func(prev float64, set bool) float64 {
		if !set {
			return sample
		}
		return max(prev+(sample-prev)/sharedWindow, 1e-9)
	})
}

// groupCosts fills each candidate's group figures (predictAll has predicted the follow-ups' TTFT).
func (d *decision) groupCosts(cands []scored, plan groupPlan) {
	margin := d.routing.SLOMargin
	for i := range cands {
		c := &cands[i]
		follow := Prediction{TTFT: c.grp.followTTFT, TPOT: c.pred.TPOT, tail: c.pred.tail}
		// The follow-ups will hold the group's prefix there: judged at the policy's margin (see prefixHome).
		c.grp.followMeets = meets(follow, d.targets, min(1, margin), 0)
		c.grp.costUSD = c.pred.CostUSD + plan.followUps*c.speed.CostPerHour/3600*
			(plan.followUncached/max(c.speed.PrefillTokensPerSecond, 1)+d.out*decodeShare(c))
	}
}

// sacrifice finds a candidate that should take the new group though its first request is late there (see
// Group placement): sorted is eligible with the meeting candidates first, by group cost, nGood of them.
func (d *decision) sacrifice(sorted []scored, nGood int, plan groupPlan) (int, bool) {
	if nGood == 0 || plan.followUps < 1 {
		return 0, false
	}
	budget := (1 - calibrationBudget) * (1 - d.targets.Objective)
	if d.model.sacrificed >= budget {
		return 0, false
	}
	limit := time.Duration(maxSacrificeLateness * float64(d.targets.TTFT-d.in.Waited))
	idleLimit := time.Duration(d.routing.SLOMargin * float64(d.targets.TTFT-d.in.Waited))
	best := -1
	for i := nGood; i < len(sorted); i++ {
		c := &sorted[i]
		if !c.grp.followMeets || c.pred.TTFT > limit || c.pred.idle <= idleLimit || c.grp.costUSD >= sorted[0].grp.costUSD*(1-costTolerance) {
			continue
		}
		if best < 0 || c.grp.costUSD < sorted[best].grp.costUSD {
			best = i
		}
	}
	return best, best >= 0
}
