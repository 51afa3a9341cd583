package picker

import (
	"github.com/zeebo/xxh3"

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

// hashPrompt hashes the prompt in blocks of the engine's own size when an engine reported it (engineBlock).
// The hashes live in a pooled buffer: give it back with releasePrompt.
func (p *Affinity) hashPrompt(in Input, engineBlock int) prompt {
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
	return pr
}

func (p *Affinity) releasePrompt(pr *prompt) { p.pool.Put(&pr.hashes) }

// weights are the scorers' weights and the bounded-load slack in force for a decision.
type weights struct {
	prefix, load, prefill, lora, eps float64
}

func (p *Affinity) weightsFor(routing policies.Routing) weights {
	w := weights{prefix: p.PrefixWeight, load: p.LoadWeight, prefill: *routing.PrefillWeight, lora: *routing.LoRAWeight, eps: p.Epsilon}
	if w.prefix == 0 && w.load == 0 {
		w.prefix, w.load = routing.PrefixWeight, routing.LoadWeight
	}
	if w.eps == 0 {
		w.eps = routing.BoundedLoadEpsilon
	}
	return w
}

// eligible scores the candidates within the bounded load — their in-flight counts (at least the engine's
// running batch, which every gateway replica reads alike) against (1+ε) × their mean, +1: so the replicas'
// bounds agree and so do their choices, while the engines' queues weigh in the load score. A candidate
// whose KV cache is full and holds none of the prompt is out (counted in kvFull). When the bound leaves no one
// it is dropped. anyMatch reports whether some candidate holds a prefix of the prompt.
//
// With perPool (SLO placement) the bound is each pool's own mean: pools on different hardware are not meant
// to carry the same load, and the SLO prediction decides between them. There it is at least the pool's batch
// size less one, when stated: a batch with room is what the cost ranking fills first.
func (p *Affinity) eligible(cands []scored, pr prompt, w weights, perPool bool) (out []scored, anyMatch bool, kvFull int) {
	var total, maxLoad int64
	for _, c := range cands {
		total += c.load
		maxLoad = max(maxLoad, c.load+c.queue)
	}
	mean := float64(total) / float64(len(cands))
	boundOf := func(c *scored) float64 { return (1+w.eps*hitSlack(c))*mean + 1 }
	if perPool {
		loads := map[*policies.Pool][2]int64{} // total, count
		for _, c := range cands {
			l := loads[c.pool]
			loads[c.pool] = [2]int64{l[0] + c.load, l[1] + 1}
		}
		boundOf = func(c *scored) float64 {
			l := loads[c.pool]
			// An endpoint with room in its stated batch is within the bound whatever its pool's mean: the SLO
			// prediction sees the wait of a full batch, and the cost ranking fills a replica before it wakes
			// another (see decodeShare).
			return max((1+w.eps*hitSlack(c))*float64(l[0])/float64(l[1])+1, float64(c.pool.MaxConcurrency-1))
		}
	}
	var key uint64
	if len(pr.hashes) > 0 {
		key = GroupKey(pr.hashes)
	}
	out = cands[:0:0]
	for _, bounded := range []bool{true, false} {
		for i := range cands {
			c := &cands[i]
			c.rank = xxh3.HashStringSeed(c.endpoint, key)
			if len(pr.hashes) > 0 {
				c.matched = p.Index.Match(c.endpoint, pr.hashes)
			}
			if c.kvFull && c.matched == 0 {
				kvFull++
				continue
			}
			if bounded && float64(c.load) > boundOf(c) {
				continue
			}
			anyMatch = anyMatch || c.matched > 0
			c.s = scoreOf(c, len(pr.hashes), pr.tokens, float64(pr.blockTokens)/pr.scale, maxLoad)
			c.s.Total = w.prefix*c.s.Prefix + w.load*c.s.Load + w.prefill*c.s.Prefill + w.lora*c.s.LoRA
			out = append(out, *c)
		}
		if len(out) > 0 || kvFull == len(cands) {
			break
		}
		kvFull = 0 // the bound left no one (it cannot, for the least loaded): take everyone that fits
	}
	return out, anyMatch, kvFull
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

// scoreOf computes a candidate's normalised scores (weights are applied by the caller).
func scoreOf(c *scored, blocks, promptTokens int, blockTokens float64, maxLoad int64) Score {
	s := Score{Endpoint: c.endpoint, LoRA: c.lora}
	if blocks > 0 {
		s.Prefix = float64(c.matched) / float64(blocks)
	}
	s.Load = 1 - float64(c.load+c.queue)/float64(maxLoad+1)
	if c.prefillTPS > 0 {
		uncached := max(0, float64(promptTokens)-float64(c.matched)*blockTokens)
		t := uncached / c.prefillTPS
		s.Prefill = prefillTau / (t + prefillTau)
	}
	return s
}

// byScore orders candidates best first: higher score, then lower cost per token, then rendezvous rank.
func byScore(a, b scored) int {
	if d := a.s.Total - b.s.Total; d > 1e-9 {
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
