package picker

import (
	"slices"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Affinity sends a prompt where its prefix is already cached, without overloading anyone, and agrees with
// other gateway replicas without sharing state:
//
//   - prefix score: the share of the prompt's leading blocks this gateway has sent to the endpoint;
//   - load score: the endpoint's requests in flight against the busiest candidate;
//   - bounded load: endpoints above (1+Epsilon) × the mean load (+1) are not candidates;
//   - a prefix no endpoint holds goes to the rendezvous-hash winner of its first blocks among the candidates,
//     so every replica sends a new conversation group to the same endpoint.
type Affinity struct {
	InFlight *fleet.InFlight
	// Engines, when set, supplies engine metrics: a saturated endpoint (queue or KV cache over the policy's
	// thresholds) or one without fresh metrics is not a candidate, and the engine's queue adds to its load.
	Engines EngineView
	Index   *Index
	Hasher  Hasher
	// Epsilon is the bounded-load slack (default 0.25).
	Epsilon float64
	// PrefixWeight and LoadWeight combine the normalised scores (defaults 2 and 1).
	PrefixWeight, LoadWeight float64
	// IndexBlocks sizes each endpoint's index (the engine's num_gpu_blocks when known).
	IndexBlocks int

	pool sync.Pool // []uint64 hash buffers
}

// EngineView is the fleet's engine metrics, as the scraper keeps them.
type EngineView interface {
	Metrics(addr string) (fleet.EngineMetrics, bool)
}

// rendezvousBlocks is how many leading blocks identify a conversation group for rendezvous hashing.
const rendezvousBlocks = 4

type scored struct {
	pool     *policies.Pool
	endpoint string
	load     int64 // this gateway's requests in flight to the endpoint
	queue    int64 // the engine's waiting requests, from its metrics
	matched  int
	score    float64
	rank     uint64 // rendezvous rank
}

// Pick implements Picker.
func (p *Affinity) Pick(snap *policies.Snapshot, model *policies.Model, req *openai.Request) (Decision, error) {
	routing := snap.Routing()
	var cands []scored
	saturated, unavailable := 0, 0
	for i := range model.Pools {
		pool := &model.Pools[i]
		for _, ep := range pool.Endpoints {
			c := scored{pool: pool, endpoint: ep, load: p.InFlight.Count(ep)}
			if p.Engines != nil {
				m, fresh := p.Engines.Metrics(ep)
				switch {
				case !fresh:
					unavailable++ // stale metrics count as saturated: no routing on old numbers
					continue
				case m.Waiting >= float64(routing.MaxWaiting) || m.KVUtil >= routing.MaxKVUtilisation:
					saturated++
					continue
				}
				c.queue = int64(m.Waiting)
			}
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return overflow(model, saturated, unavailable)
	}
	var hashes []uint64
	if buf, ok := p.pool.Get().(*[]uint64); ok {
		hashes = (*buf)[:0]
	}
	if req != nil && req.Prompt != nil {
		hashes = p.Hasher.Hash(hashes, Seed(model.Name, ""), req.Prompt)
	}
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
	var key uint64
	if len(hashes) > 0 {
		key = hashes[min(len(hashes), rendezvousBlocks)-1]
	}
	anyMatch := false
	eligible := cands[:0:0]
	for i := range cands {
		c := &cands[i]
		c.rank = xxh3.HashStringSeed(c.endpoint, key)
		if float64(c.load) > bound {
			continue
		}
		if len(hashes) > 0 {
			c.matched = p.Index.Match(c.endpoint, hashes)
			anyMatch = anyMatch || c.matched > 0
		}
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(c.matched) / float64(len(hashes))
		}
		c.score = wPrefix*prefix + wLoad*(1-float64(c.load+c.queue)/float64(maxLoad+1))
		eligible = append(eligible, *c)
	}
	if len(eligible) == 0 { // cannot happen (the least loaded is always within the bound); be safe
		eligible = cands
	}
	slices.SortFunc(eligible, func(a, b scored) int {
		if len(hashes) > 0 && !anyMatch {
			// A new prefix: rendezvous order, so that every gateway replica agrees.
			return cmpDesc(a.rank, b.rank)
		}
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return cmpDesc(a.rank, b.rank)
	})
	best := eligible[0]
	if len(hashes) > 0 && !anyMatch && len(eligible) > 1 && 2*eligible[1].load < best.load {
		// A new prefix: its second rendezvous choice when that one has less than half the load of the first
		// (power of two choices, damped). Every replica agrees on the two, and only clear imbalances make them
		// diverge; idle capacity still gets used when prompts share nothing.
		best, eligible[0], eligible[1] = eligible[1], eligible[1], eligible[0]
	}
	if len(hashes) > 0 {
		p.Index.Credit(best.endpoint, hashes, p.IndexBlocks)
	}
	limit := snap.Gateway().MaxEndpointsPerDecision
	eps2 := []string{best.endpoint}
	for _, c := range eligible[1:] {
		if len(eps2) >= limit {
			break
		}
		if c.pool == best.pool {
			eps2 = append(eps2, c.endpoint)
		}
	}
	return Decision{Pool: best.pool, Endpoints: eps2}, nil
}

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
// allows it for this condition, otherwise 429 (saturated: retry soon) or 503 (unavailable).
func overflow(model *policies.Model, saturated, unavailable int) (Decision, error) {
	cond := policies.WhenUnavailable
	if saturated > 0 {
		cond = policies.WhenSaturated
	}
	for i := range model.Fallbacks {
		f := &model.Fallbacks[i]
		if slices.Contains(f.When, cond) {
			return Decision{Fallback: f}, nil
		}
	}
	if saturated > 0 {
		return Decision{}, openai.Overloaded(model.Name)
	}
	return Decision{}, openai.NoCapacity(model.Name)
}
