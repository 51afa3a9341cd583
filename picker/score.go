package picker

import (
	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/picker/scorers"
	"github.com/infergate/infergate/policies"
)

// prompt is what scoring needs of the request's prompt: its block hashes (empty when it has no prompt), its
// estimated tokens, the same in the engine's tokens, and the block length in estimated tokens.
type prompt struct {
	hashes      []uint64
	estimated   int
	tokens      int     // in the engine's tokens: estimated ÷ scale
	blockTokens int     // estimated tokens per block
	scale       float64 // estimated ÷ real tokens, learnt by Observe
}

// engineBlockTokens is the engine's tokens per index block.
func (pr *prompt) engineBlockTokens() float64 { return float64(pr.blockTokens) / pr.scale }

// hashPrompt hashes the prompt in blocks of the engine's own size when an engine reported it (engineBlock).
// The hashes live in a pooled buffer, which release gives back.
func (d *decision) hashPrompt(engineBlock int) {
	p, in := d.p, d.in
	hasher := p.Hasher
	if engineBlock > 0 {
		hasher.BlockBytes = engineBlock * CharsPerToken // the engine's own block, as it reports it
	}
	pr := prompt{blockTokens: max(1, hasher.BlockBytes/CharsPerToken), scale: p.tokenScale()}
	if buf, ok := p.pool.Get().(*[]uint64); ok {
		pr.hashes = (*buf)[:0]
	}
	if in.Request != nil && in.Request.Prompt != nil {
		pr.hashes = hasher.HashWithInstructions(pr.hashes, Seed(in.Model.Name, in.Adapter), in.Request.Instructions, in.Request.Prompt)
		pr.estimated = max(in.Request.EstimatePromptTokens(), len(pr.hashes)*pr.blockTokens)
	}
	pr.tokens = int(float64(pr.estimated) / pr.scale)
	d.prompt, d.hashed = pr, true
}

// bound keeps the candidates within the bounded load — their in-flight counts (at least the engine's running
// batch, which every gateway replica reads alike) against (1+ε) × their mean, +1: so the replicas' bounds agree
// and so do their choices, while the engines' queues weigh in the load score. A candidate whose KV cache is
// full and holds none of the prompt is out (counted in kvFull), and so is one whose whole KV cache cannot hold
// the request (counted in d.tooLong: the engine would refuse it). When the bound leaves no one it is dropped.
// anyMatch reports whether some kept candidate holds a prefix of the prompt. Each candidate of cands learns
// what the index holds of the prompt there and its rendezvous rank.
func (d *decision) bound(cands []scored) (out []scored, anyMatch bool, kvFull int) {
	hashes := d.prompt.hashes
	var key uint64
	if len(hashes) > 0 {
		key = GroupKey(hashes)
	}
	for i := range cands {
		c := &cands[i]
		c.rank = xxh3.HashStringSeed(c.endpoint, key)
		if len(hashes) > 0 {
			c.matched = d.p.Index.Match(c.endpoint, hashes)
		}
	}
	limit := d.loadBound(cands)
	need := d.contextTokens()
	out = d.buf.bounded[:0]
	defer func() { d.buf.bounded = out }() // keep the room it grew to
	for _, bounded := range []bool{true, false} {
		d.tooLong = 0
		for i := range cands {
			c := &cands[i]
			if need > 0 && c.capacity > 0 && float64(c.capacity)*d.prompt.engineBlockTokens() < need {
				d.tooLong++ // the engine's whole KV cache cannot hold the request: it would refuse it
				continue
			}
			if c.kvFull && c.matched == 0 {
				kvFull++
				continue
			}
			if bounded && float64(c.load) > limit.of(c) {
				continue
			}
			anyMatch = anyMatch || c.matched > 0
			out = append(out, *c)
		}
		if len(out) > 0 || kvFull+d.tooLong == len(cands) {
			break
		}
		kvFull = 0 // the bound left no one (it cannot, for the least loaded): take everyone that fits
	}
	return out, anyMatch, kvFull
}

// contextTokens is what a request needs of an engine's KV cache — its prompt, in the engine's tokens, and the
// most output it may produce — once the picker has learnt the engine's tokens per estimated token (0 before:
// an estimate from bytes alone could rule out an engine that would serve the request).
func (d *decision) contextTokens() float64 {
	if d.p.scale.Load() == 0 || d.prompt.tokens == 0 {
		return 0
	}
	out := d.out
	if !d.slo {
		out = float64(outputTokens(d.snap, d.in))
	}
	return float64(d.prompt.tokens) + out
}

// loadLimit is the bounded-load limit of the candidates of one decision: (1+ε) × their mean in-flight, +1
// (2ε for one holding a prefix of the prompt).
//
// Under SLO placement (perPool) the bound is each pool's own mean: pools on different hardware are not meant to
// carry the same load, and the SLO prediction decides between them. There it is at least the pool's batch size
// less one, when stated: a batch with room is what the cost ranking fills first.
type loadLimit struct {
	eps, mean float64
	perPool   map[*policies.Pool][2]int64 // total, count; nil unless SLO placement
}

// loadBound measures the candidates' load for the bound.
func (d *decision) loadBound(cands []scored) loadLimit {
	l := loadLimit{eps: d.routing.BoundedLoadEpsilon}
	if !d.slo {
		var total int64
		for _, c := range cands {
			total += c.load
		}
		l.mean = float64(total) / float64(len(cands))
		return l
	}
	l.perPool = map[*policies.Pool][2]int64{}
	for _, c := range cands {
		t := l.perPool[c.pool]
		l.perPool[c.pool] = [2]int64{t[0] + c.load, t[1] + 1}
	}
	return l
}

// of is a candidate's limit.
func (l *loadLimit) of(c *scored) float64 {
	if l.perPool == nil {
		return (1+l.eps*hitSlack(c))*l.mean + 1
	}
	t := l.perPool[c.pool]
	// An endpoint with room in its stated batch is within the bound whatever its pool's mean: the SLO prediction
	// sees the wait of a full batch, and the cost ranking fills a replica before it wakes another (see
	// decodeShare).
	return max((1+l.eps*hitSlack(c))*float64(t[0])/float64(t[1])+1, float64(c.pool.MaxConcurrency-1))
}

// hitSlackFactor multiplies ε for an endpoint holding a prefix of the prompt: sending the request elsewhere
// costs a full prefill there and a second copy of the prefix in the fleet's caches, so a held prefix may load
// its endpoint further before the request spills.
const hitSlackFactor = 2

func hitSlack(c *scored) float64 {
	if c.matched > 0 {
		return hitSlackFactor
	}
	return 1
}

// score has every scorer of the table score each eligible candidate; the weighted sum is its total, and the
// weighted sum of the hardware-fit scorers its fit. all is every candidate, against whose busiest the load
// scorer measures.
func (d *decision) score(eligible, all []scored) {
	var maxLoad int64
	for _, c := range all {
		maxLoad = max(maxLoad, c.load+c.queue)
	}
	pr := &d.prompt
	blockTokens := pr.engineBlockTokens()
	for i := range eligible {
		c := &eligible[i]
		f := scorers.Candidate{PromptBlocks: len(pr.hashes), MatchedBlocks: c.matched, Load: c.load + c.queue, MaxLoad: maxLoad,
			UncachedTokens: max(0, float64(pr.tokens)-float64(c.matched)*blockTokens), PrefillTokensPerSecond: c.prefillTPS,
			AdapterLoaded: c.adapterLoaded}
		c.total, c.fit = 0, 0
		for j, s := range d.table {
			v := s.Score(f)
			c.parts[j] = v
			c.total += d.weights[j] * v
			if s.Fit {
				c.fit += d.weights[j] * v
			}
		}
	}
}

// scoreOf is a candidate's Score as routing.debugScores shows it.
func (d *decision) scoreOf(c *scored) Score {
	s := Score{Endpoint: c.endpoint, Total: c.total, Parts: make([]ScorePart, len(d.table)),
		TTFT: c.pred.TTFT, TPOT: c.pred.TPOT, CostUSD: c.pred.CostUSD, MeetsSLO: c.meets,
		FollowUpTTFT: c.grp.followTTFT, GroupCostUSD: c.grp.costUSD}
	for j, sc := range d.table {
		s.Parts[j] = ScorePart{Scorer: sc.Name, Value: c.parts[j]}
	}
	return s
}

// byScore orders candidates best first: higher score, then lower cost per token, then rendezvous rank.
func byScore(a, b *scored) int {
	if d := a.total - b.total; d > 1e-9 {
		return -1
	} else if d < -1e-9 {
		return 1
	}
	if a.cost != b.cost {
		return cmpFloat(a.cost, b.cost)
	}
	return cmpDesc(a.rank, b.rank)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpAsc(a, b uint64) int { return -cmpDesc(a, b) }

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
