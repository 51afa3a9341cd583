package picker

import (
	"math"
)

// order puts the eligible candidates in the order the decision takes them: by score, or, for a prefix no
// endpoint holds, by placeNew; scores within tieTolerance of the best are ties, which the cheapest hardware
// takes.
func (d *decision) order(eligible, all []scored, anyMatch bool) []scored {
	sortScored(eligible, false, byScore)
	if hashes := d.prompt.hashes; len(hashes) > 0 {
		sharing := d.p.noteSharing(anyMatch)
		if !anyMatch {
			return d.placeNew(eligible, all, sharing >= consistentPlacement, GroupKey(hashes))
		}
	}
	n := 1
	for n < len(eligible) && eligible[n].total >= eligible[0].total-tieTolerance {
		n++
	}
	sortScored(eligible[:n], true, func(a, b *scored) int { return cmpFloat(a.cost, b.cost) })
	return eligible
}

// decide is the last stage: it turns the ordered candidates into the Decision — the first, then the best
// others of its pool as Envoy's retry endpoints, up to the policy's limit — and credits the prompt to the
// first in the index.
func (d *decision) decide(ordered []scored) Decision {
	p, snap, in, pr := d.p, d.snap, d.in, &d.prompt
	best := ordered[0]
	var basis churnBasis
	if len(pr.hashes) > 0 {
		// The index holds as much prompt text as the engine's cache: its blocks are the engine's in estimated
		// tokens, so the engine's block count scales by estimated ÷ real tokens.
		capacity := int(float64(best.capacity) * pr.scale)
		if capacity == 0 {
			capacity = p.IndexBlocks
		}
		c := p.Index.Credit(best.endpoint, pr.hashes, capacity)
		carried := 0
		if p.shares(&best, pr, c.Faded) {
			p.share(&best, pr, capacity)
			carried = c.Added - c.AddedPastShared // the others learn these from the placement
		}
		basis = churnBasis{blockTokens: pr.engineBlockTokens(), carried: carried, added: c.Added - carried}
	}
	limit := snap.Gateway().MaxEndpointsPerDecision
	chosen := []string{best.endpoint}
	for _, c := range ordered[1:] {
		if len(chosen) >= limit {
			break
		}
		if c.pool == best.pool {
			chosen = append(chosen, c.endpoint)
		}
	}
	dec := Decision{Pool: best.pool, Endpoints: chosen, Adapter: in.Adapter, EstimatedPromptTokens: pr.estimated,
		ExpectedCachedTokens: int(float64(best.matched*pr.blockTokens) / pr.scale), Load: best.load, churn: basis}
	if len(pr.hashes) > 0 {
		dec.FirstBlock, dec.GroupBlock = pr.hashes[0], GroupKey(pr.hashes)
	}
	if best.pred.set {
		p.noteShared(float64(best.matched*pr.blockTokens), float64(pr.estimated)) // φ, which only SLO placement reads
		best.pred.sentAt = d.now
		dec.Predicted = best.pred
		p.pred.sent(best.endpoint, best.pred, in.Model.Name, d.busy, d.sacrificing)
	}
	if d.routing.DebugScores {
		dec.Scores = make([]Score, len(ordered))
		for i := range ordered {
			dec.Scores[i] = d.scoreOf(&ordered[i])
		}
	}
	return dec
}

// placeNew orders the candidates for a prefix no endpoint holds (or one the index has forgotten): the first
// is where it starts, the others follow in score order as retry endpoints. all is every candidate of the
// model, for the group bound.
//
// When prompts share prefixes (consistent), a new group goes to the rendezvous winner of its first blocks
// among the endpoints holding fewer than (1+ε) × the mean number of groups (counting this one). Every gateway
// replica receiving a share of the same traffic has seen about the same groups, so they agree on where the
// next one starts — and the groups stay spread evenly, which a bare rendezvous hash does not do for a few
// dozen groups. An endpoint whose index aged the group out (Index.AgedOut) is in the band whatever the bound,
// and first among those of the same hardware fit and price: this replica's index ages with its share of the
// traffic, the engine's cache with everyone's, so the engine often still holds it, and where it does not, the
// miss costs what a miss elsewhere would. When prompts do not come back, agreement is worth nothing and balance
// is all: the least loaded endpoint (this gateway's own requests in flight plus the engine's queue), and among
// equals the one sent a request longest ago. Either way the best hardware for the prompt (prefill and LoRA scores, in steps of
// tieTolerance) and then the cheapest come first, and among those, for shared prompts, an endpoint holding no
// group at all before the rendezvous rank: otherwise the few groups a slower class gets could all hash to one
// of its replicas and leave the other idle.
func (d *decision) placeNew(eligible, all []scored, consistent bool, group uint64) []scored {
	p, eps := d.p, d.routing.BoundedLoadEpsilon
	var band, rest []scored
	if consistent {
		held := make(map[string]int, len(all)) // each endpoint's groups, read once
		groups := 0
		for i := range all {
			held[all[i].endpoint] = p.Index.Groups(all[i].endpoint)
			groups += held[all[i].endpoint]
		}
		limit := int(math.Ceil((1 + eps) * float64(groups+1) / float64(len(all))))
		for _, c := range eligible {
			c.groups = held[c.endpoint]
			if c.agedOut = p.Index.AgedOut(c.endpoint, group); c.agedOut || held[c.endpoint] < limit {
				band = append(band, c)
			} else {
				rest = append(rest, c)
			}
		}
		if len(band) == 0 { // every endpoint under the group bound is out for load or KV: the others take it
			band, rest = rest, nil
		}
	} else {
		// This gateway's own requests, not the engine's batch that every replica reads alike: replicas that
		// balance alike would all pick the same least loaded endpoint until its next reading.
		least := int64(math.MaxInt64)
		for _, c := range eligible {
			least = min(least, c.own+c.queue)
		}
		for _, c := range eligible {
			if c.own+c.queue == least {
				c.lastStarted = p.InFlight.LastStarted(c.endpoint)
				band = append(band, c)
			} else {
				rest = append(rest, c)
			}
		}
	}
	sortScored(band, false, func(a, b *scored) int {
		if fa, fb := fitStep(a), fitStep(b); fa != fb {
			return cmpFloat(fb, fa)
		}
		if a.cost != b.cost {
			return cmpFloat(a.cost, b.cost)
		}
		if a.agedOut != b.agedOut { // where the group was: the engine may still hold it
			return trueFirst(a.agedOut)
		}
		if ea, eb := a.groups == 0, b.groups == 0; ea != eb { // an endpoint holding no group takes a new one first
			return trueFirst(ea)
		}
		if a.lastStarted != b.lastStarted {
			return cmpAsc(a.lastStarted, b.lastStarted)
		}
		return cmpDesc(a.rank, b.rank)
	})
	return append(band, rest...)
}

// fitStep is a candidate's hardware fit (the weighted hardware-fit scorers) in steps of tieTolerance.
func fitStep(c *scored) float64 { return math.Floor(c.fit / tieTolerance) }

// trueFirst orders two candidates that differ in a flag: the one with it (a's flag given) first.
func trueFirst(a bool) int {
	if a {
		return -1
	}
	return 1
}
