package picker

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Affinity sends a prompt where its prefix is already cached, on the right hardware, without overloading
// anyone, and agrees with other gateway replicas without sharing state. Normalised scorers, weighted by the
// policy's routing section, add up to each candidate's score:
//
//   - prefix: the share of the prompt's leading blocks this gateway has sent to the endpoint;
//   - load: the endpoint's requests in flight (this gateway's) plus its engine queue, against the busiest;
//   - prefill: how fast the endpoint's hardware class computes the prompt's uncached tokens (τ/(t+τ), t in
//     seconds), so long uncached prompts prefer the class with faster prefill;
//   - lora: 1 where the requested adapter is loaded.
//
// Bounded load: endpoints above (1+ε) × the mean load (+1) are not candidates. The best score wins; scores
// within tieTolerance of it are ties, which go to the cheapest hardware (cost per token). A prefix no endpoint
// holds is placed by placeNew: while prompts share prefixes, at the rendezvous-hash winner of its first blocks
// among endpoints under a bound on conversation groups, so that gateway replicas that never talk to each
// other start a group on the same endpoint; while they do not, on the least loaded endpoint.
type Affinity struct {
	InFlight *fleet.InFlight
	// Engines, when set, supplies engine metrics: a saturated endpoint (queue or KV cache over the policy's
	// thresholds) or one without fresh metrics is not a candidate, the engine's queue adds to its load, its
	// KV block size sets the hashing block and its num_gpu_blocks sizes its index.
	Engines EngineView
	Index   *Index
	Hasher  Hasher
	// Epsilon is the bounded-load slack (default: the policy's).
	Epsilon float64
	// PrefixWeight and LoadWeight override the policy's weights when either is set.
	PrefixWeight, LoadWeight float64
	// IndexBlocks sizes each endpoint's index when the engine does not report num_gpu_blocks.
	IndexBlocks int

	pool    sync.Pool     // []uint64 hash buffers
	scale   atomic.Uint64 // float64 bits: estimated ÷ real prompt tokens, learnt by Observe; 0 until then
	sharing atomic.Uint64 // float64 bits: share of recent prompts matching a held prefix (noteSharing); 0 until set
}

// DefaultMaxBlocks is how many leading blocks of a prompt are hashed: 512 blocks of 16 tokens, about 8K tokens,
// covers the shared system prompts and conversation heads that decide affinity, and keeps a 100K-token prompt
// cheap.
const DefaultMaxBlocks = 512

// NewAffinity is the picker infergate serve runs (and the routing benchmark measures): the engine's block size
// for hashing when it reports one, DefaultBlockTokens until then, and DefaultMaxBlocks.
func NewAffinity(inflight *fleet.InFlight, engines EngineView) *Affinity {
	return &Affinity{InFlight: inflight, Engines: engines, Index: NewIndex(),
		Hasher: Hasher{BlockBytes: DefaultBlockTokens * CharsPerToken, MaxBlocks: DefaultMaxBlocks}}
}

// Observe implements Observer. It keeps an exponentially weighted mean of estimated ÷ real prompt tokens, so
// that the index holds as much prompt text as the engine's KV cache really does and prefill times use real
// tokens. And when the engine served far fewer cached tokens than the index promised, the engine evicted the
// prefix (or another gateway's traffic did): the index forgets it there, and the prefix is placed again as a
// new one, where the other gateway replicas place it.
func (p *Affinity) Observe(d Decision, u openai.Usage) {
	if len(d.Endpoints) > 0 && d.ServedBy != "" && d.ServedBy != d.Endpoints[0] {
		// Envoy retried the request elsewhere: the chosen endpoint never saw the prompt, so what the index
		// recorded there is not true. The served endpoint's cache is learnt from its own later answers.
		p.Index.Forget(d.Endpoints[0], d.FirstBlock)
		p.Index.Forget(d.Endpoints[0], d.GroupBlock)
	} else if u.CachedReported && d.ExpectedCachedTokens > 0 && len(d.Endpoints) > 0 && 2*u.CachedTokens < int64(d.ExpectedCachedTokens) {
		p.Index.Forget(d.Endpoints[0], d.FirstBlock)
		p.Index.Forget(d.Endpoints[0], d.GroupBlock)
	}
	estimated, real := d.EstimatedPromptTokens, int(u.PromptTokens)
	if estimated <= 0 || real <= 0 {
		return
	}
	sample := min(8, max(0.125, float64(estimated)/float64(real)))
	for {
		old := p.scale.Load()
		next := sample
		if old != 0 {
			next = 0.95*math.Float64frombits(old) + 0.05*sample
		}
		if p.scale.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// noteSharing records whether a prompt matched a prefix held somewhere and returns the share of recent
// prompts that did (before this one).
func (p *Affinity) noteSharing(matched bool) float64 {
	sample := 0.0
	if matched {
		sample = 1
	}
	for {
		old := p.sharing.Load()
		prev := initialSharing
		if old != 0 {
			prev = math.Float64frombits(old)
		}
		next := max(prev+(sample-prev)/sharingWindow, 1e-9) // never 0, which means unset
		if p.sharing.CompareAndSwap(old, math.Float64bits(next)) {
			return prev
		}
	}
}

// placeNew orders the candidates for a prefix no endpoint holds (or one the index has forgotten): the first
// is where it starts, the others follow in score order as retry endpoints. all is every candidate of the
// model, for the group bound.
//
// When prompts share prefixes (consistent), a new group goes to the rendezvous winner of its first blocks
// among the endpoints holding fewer than (1+ε) × the mean number of groups (counting this one). Every gateway
// replica receiving a share of the same traffic has seen about the same groups, so they agree on where the
// next one starts — and the groups stay spread evenly, which a bare rendezvous hash does not do for a few
// dozen groups. When prompts do not come back, agreement is worth nothing and balance is all: the least
// loaded endpoint (this gateway's requests in flight plus the engine's queue), and among equals the one sent a
// request longest ago. Either way the best hardware for the prompt (prefill and LoRA scores, in steps of
// tieTolerance) and then the cheapest come first.
func (p *Affinity) placeNew(eligible, all []scored, consistent bool, eps float64, fit func(*scored) float64) []scored {
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
			if held[c.endpoint] < limit {
				band = append(band, c)
			} else {
				rest = append(rest, c)
			}
		}
		if len(band) == 0 { // every endpoint under the group bound is out for load or KV: the others take it
			band, rest = rest, nil
		}
	} else {
		least := int64(math.MaxInt64)
		for _, c := range eligible {
			least = min(least, c.load+c.queue)
		}
		for _, c := range eligible {
			if c.load+c.queue == least {
				c.lastStarted = p.InFlight.LastStarted(c.endpoint)
				band = append(band, c)
			} else {
				rest = append(rest, c)
			}
		}
	}
	slices.SortFunc(band, func(a, b scored) int {
		if fa, fb := fit(&a), fit(&b); fa != fb {
			return cmpFloat(fb, fa)
		}
		if a.cost != b.cost {
			return cmpFloat(a.cost, b.cost)
		}
		if a.lastStarted != b.lastStarted {
			return cmpAsc(a.lastStarted, b.lastStarted)
		}
		return cmpDesc(a.rank, b.rank)
	})
	return append(band, rest...)
}

// tokenScale is estimated ÷ real tokens (1 until Observe has data).
func (p *Affinity) tokenScale() float64 {
	if b := p.scale.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// EngineView is the fleet's engine metrics, as the scraper keeps them.
type EngineView interface {
	Metrics(addr string) (fleet.EngineMetrics, bool)
}

// rendezvousBlocks is how many leading blocks identify a conversation group for rendezvous hashing.
const rendezvousBlocks = 4

// New prefixes are placed consistently across gateway replicas while at least consistentPlacement of recent
// prompts (an exponential average over about sharingWindow of them, starting at initialSharing) matched a
// prefix already held somewhere; below that, prompts rarely come back and new ones are placed for balance.
const (
	consistentPlacement = 0.25
	sharingWindow       = 32
	initialSharing      = 0.5
)

// tieTolerance is how close two candidates' scores must be to count as a tie.
const tieTolerance = 0.02

// prefillTau is the prefill scorer's scale: a prompt whose uncached part takes τ to prefill scores 0.5.
const prefillTau = 0.25 // seconds

type scored struct {
	pool       *policies.Pool
	endpoint   string
	load       int64 // this gateway's requests in flight to the endpoint
	queue      int64 // the engine's waiting requests, from its metrics
	capacity   int   // the engine's KV blocks, 0 when unknown
	prefillTPS float64
	cost       float64 // USD per token of the hardware class
	matched    int
	lora       float64
	kvFull     bool // the engine's KV cache is over the policy's threshold while requests wait
	s          Score
	rank       uint64 // rendezvous rank
	// lastStarted is when this gateway last sent the endpoint a request (placement of unshared prompts).
	lastStarted uint64
}

// Pick implements Picker.
func (p *Affinity) Pick(snap *policies.Snapshot, in Input) (Decision, error) {
	model := in.Model
	routing := snap.Routing()
	var cands []scored
	saturated, unavailable, blockTokens := 0, 0, 0
	for i := range model.Pools {
		pool := &model.Pools[i]
		if in.Tenant != nil && !snap.PoolAllowed(in.Tenant, pool) {
			continue
		}
		tps, cost := snap.PrefillTokensPerSecond(pool.HardwareClass), snap.CostPerToken(pool.HardwareClass)
		for _, ep := range pool.Endpoints {
			c := scored{pool: pool, endpoint: ep, load: p.InFlight.Count(ep), prefillTPS: tps, cost: cost}
			if p.Engines != nil {
				m, fresh := p.Engines.Metrics(ep)
				switch {
				case !fresh:
					unavailable++ // stale metrics count as saturated: no routing on old numbers
					continue
				case m.Waiting >= float64(routing.MaxWaiting):
					saturated++
					continue
				}
				// A full KV cache that already makes requests wait rules out prompts it does not hold (decided
				// below): a cache hit needs few new blocks, a miss needs them all.
				c.kvFull = m.KVUtil >= routing.MaxKVUtilisation && m.Waiting > 0
				c.queue, c.capacity = int64(m.Waiting), m.NumBlocks
				if blockTokens == 0 {
					blockTokens = m.BlockSize
				}
				if in.Adapter != "" && slices.Contains(m.LoRAs, in.Adapter) {
					c.lora = 1
				}
			}
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return overflow(model, in.Adapter, saturated, unavailable)
	}
	hasher := p.Hasher
	if blockTokens > 0 {
		hasher.BlockBytes = blockTokens * CharsPerToken // the engine's own block, as it reports it
	}
	blockTokens = max(1, hasher.BlockBytes/CharsPerToken)
	var hashes []uint64
	if buf, ok := p.pool.Get().(*[]uint64); ok {
		hashes = (*buf)[:0]
	}
	estimated, scale := 0, p.tokenScale()
	if in.Request != nil && in.Request.Prompt != nil {
		hashes = hasher.Hash(hashes, Seed(model.Name, in.Adapter), in.Request.Prompt)
		estimated = max(in.Request.EstimatePromptTokens(), len(hashes)*blockTokens)
	}
	promptTokens := int(float64(estimated) / scale) // in the engine's tokens
	defer func() { p.pool.Put(&hashes) }()

	// Bounded load uses this gateway's own in-flight counts: every gateway replica sees a similar share of
	// the traffic, so their bounds agree and so do their choices. The engines' queues, which all replicas
	// see alike, weigh in the load score.
	var total, maxLoad int64
	for _, c := range cands {
		total += c.load
		maxLoad = max(maxLoad, c.load+c.queue)
	}
	eps := p.Epsilon
	if eps == 0 {
		eps = routing.BoundedLoadEpsilon
	}
	bound := (1+eps)*float64(total)/float64(len(cands)) + 1
	wPrefix, wLoad := p.PrefixWeight, p.LoadWeight
	if wPrefix == 0 && wLoad == 0 {
		wPrefix, wLoad = routing.PrefixWeight, routing.LoadWeight
	}
	wPrefill, wLoRA := *routing.PrefillWeight, *routing.LoRAWeight
	var key uint64
	if len(hashes) > 0 {
		key = GroupKey(hashes)
	}
	anyMatch, kvFull := false, 0
	eligible := cands[:0:0]
	for _, bounded := range []bool{true, false} {
		for i := range cands {
			c := &cands[i]
			c.rank = xxh3.HashStringSeed(c.endpoint, key)
			if len(hashes) > 0 {
				c.matched = p.Index.Match(c.endpoint, hashes)
			}
			if c.kvFull && c.matched == 0 {
				kvFull++
				continue
			}
			if bounded && float64(c.load) > bound {
				continue
			}
			anyMatch = anyMatch || c.matched > 0
			c.s = scoreOf(c, len(hashes), promptTokens, float64(blockTokens)/scale, maxLoad)
			c.s.Total = wPrefix*c.s.Prefix + wLoad*c.s.Load + wPrefill*c.s.Prefill + wLoRA*c.s.LoRA
			eligible = append(eligible, *c)
		}
		if len(eligible) > 0 || kvFull == len(cands) {
			break
		}
		kvFull = 0 // the bound left no one (it cannot, for the least loaded): take everyone that fits
	}
	if len(eligible) == 0 {
		return overflow(model, in.Adapter, saturated+kvFull, unavailable)
	}
	slices.SortFunc(eligible, byScore)
	if len(hashes) > 0 {
		sharing := p.noteSharing(anyMatch)
		if !anyMatch {
			fit := func(c *scored) float64 { return math.Floor((wPrefill*c.s.Prefill + wLoRA*c.s.LoRA) / tieTolerance) }
			eligible = p.placeNew(eligible, cands, sharing >= consistentPlacement, eps, fit)
		}
	}
	if len(hashes) == 0 || anyMatch {
		// Scores within tieTolerance of the best are ties: the cheapest hardware takes them.
		n := 1
		for n < len(eligible) && eligible[n].s.Total >= eligible[0].s.Total-tieTolerance {
			n++
		}
		slices.SortStableFunc(eligible[:n], func(a, b scored) int { return cmpFloat(a.cost, b.cost) })
	}
	best := eligible[0]
	if len(hashes) > 0 {
		// The index holds as much prompt text as the engine's cache: its blocks are the engine's in estimated
		// tokens, so the engine's block count scales by estimated ÷ real tokens.
		capacity := int(float64(best.capacity) * scale)
		if capacity == 0 {
			capacity = p.IndexBlocks
		}
		p.Index.Credit(best.endpoint, hashes, capacity)
	}
	limit := snap.Gateway().MaxEndpointsPerDecision
	chosen := []string{best.endpoint}
	for _, c := range eligible[1:] {
		if len(chosen) >= limit {
			break
		}
		if c.pool == best.pool {
			chosen = append(chosen, c.endpoint)
		}
	}
	d := Decision{Pool: best.pool, Endpoints: chosen, Adapter: in.Adapter, EstimatedPromptTokens: estimated,
		ExpectedCachedTokens: int(float64(best.matched*blockTokens) / scale)}
	if len(hashes) > 0 {
		d.FirstBlock, d.GroupBlock = hashes[0], GroupKey(hashes)
	}
	if routing.DebugScores {
		d.Scores = make([]Score, len(eligible))
		for i, c := range eligible {
			d.Scores[i] = c.s
		}
	}
	return d, nil
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

// overflow decides for a model none of whose endpoints can take a request: its managed fallback if the policy
// allows it for this condition (never for a LoRA adapter, which the provider does not have), otherwise 429
// (saturated: retry soon) or 503 (unavailable).
func overflow(model *policies.Model, adapter string, saturated, unavailable int) (Decision, error) {
	cond := policies.WhenUnavailable
	if saturated > 0 {
		cond = policies.WhenSaturated
	}
	for i := range model.Fallbacks {
		f := &model.Fallbacks[i]
		if adapter == "" && slices.Contains(f.When, cond) {
			return Decision{Fallback: f}, nil
		}
	}
	if saturated > 0 {
		return Decision{}, openai.Overloaded(model.Name)
	}
	return Decision{}, openai.NoCapacity(model.Name)
}

// PolicyChanged forgets endpoints the new policy no longer lists.
func (p *Affinity) PolicyChanged(snap *policies.Snapshot) {
	live := map[string]bool{}
	for i := range snap.Policy.Spec.Models {
		for _, pool := range snap.Policy.Spec.Models[i].Pools {
			for _, ep := range pool.Endpoints {
				live[ep] = true
			}
		}
	}
	p.Index.Retain(func(ep string) bool { return live[ep] })
}
