package picker

import (
	"math"
	"sync/atomic"
	"time"
)

// Placement is a gateway replica's news that it started a prompt on an endpoint where its index did not hold
// the prompt's conversation group. The other replicas credit it to their own index (Learn), so that all of
// them know where every group lives and balance new groups on the same counts: what one replica alone does
// with its whole view of the traffic, N replicas then do together, at the cost of one message per new copy of
// a group rather than a round trip per request.
type Placement struct {
	Endpoint string
	// Hashes are the prompt's leading block hashes (at most MaxSharedBlocks), seeded by model and adapter as
	// every replica seeds them.
	Hashes []uint64
	// Capacity is the endpoint's index size in blocks at the sender, for a receiver that has not indexed the
	// endpoint yet (0: the receiver's default).
	Capacity int
	// Forgotten reports the opposite news: the endpoint answered with far fewer cached tokens than the index
	// promised (its engine evicted the group), or never saw the prompt (Envoy retried it elsewhere). Hashes
	// are then the prompt's first block and group block, which receivers forget there, so that the group is
	// placed again once, where every replica places it, instead of missing once at every replica.
	Forgotten bool
	// Churn, set instead of Hashes, is how many blocks this replica's own requests added to the endpoint's
	// cache, beyond those its placements carried, since its last report (see Affinity.ChurnEvery). Receivers
	// age the endpoint's index by as many blocks (Index.Churn): the engine evicts by everyone's traffic, and
	// an index that saw only its own replica's would keep groups the engine has dropped.
	Churn int
	// Prefill, set instead of Hashes, reports a long prompt this replica sent the endpoint: its uncached
	// tokens; Due is how long after sending its first token was due, ID a random number that tells a replay.
	// Receivers count it in the endpoint's prefill ahead until then and in its prefill share (otherprefill.go);
	// Booked, a split's booking at its decoder, in the prefill ahead only.
	Prefill int
	Due     time.Duration
	ID      uint64
	Booked  bool
	// Done, with ID and no Prefill, reports that long prompt's first token out: receivers release it.
	Done bool
}

// Placements carries this replica's placements to the others (the placements package does it over Redis
// pub/sub). Publish is called on the request path: it must not block, and it owns the Placement it is given.
type Placements interface {
	Publish(Placement)
}

// MaxSharedBlocks is how many leading blocks a placement carries: 256 blocks of 16 tokens cover the system
// prompts and conversation heads that make groups, and keep a message under 2.1 KB.
const MaxSharedBlocks = 256

// MaxLearntCapacity bounds the index size a placement from elsewhere may ask for (2M blocks of 16 tokens is
// more KV cache than an 8-GPU node holds for any model).
const MaxLearntCapacity = 1 << 21

// Learn credits another replica's placement to this replica's index (or forgets what it reports forgotten, or
// counts the long prompt it reports sent, or releases one done). It reports false, and learns nothing, for an
// endpoint the policy does not list (once PolicyChanged has run), a placement without blocks, a long prompt due
// before it was sent, or one sent to (or done at) an endpoint this replica has not predicted for yet.
func (p *Affinity) Learn(pl Placement) bool {
	if pl.Endpoint == "" || (len(pl.Hashes) == 0 && pl.Churn <= 0 && pl.Prefill <= 0 && !pl.Done) || pl.Due < 0 {
		return false
	}
	if live := p.live.Load(); live != nil && !(*live)[pl.Endpoint] {
		return false
	}
	if pl.Done && len(pl.Hashes) == 0 {
		return p.pred.learnDone(pl.Endpoint, pl.ID)
	}
	if pl.Prefill > 0 && len(pl.Hashes) == 0 {
		return p.pred.learnPrefill(pl.Endpoint, pl.ID, float64(min(pl.Prefill, MaxPublishedPrefill)), min(pl.Due, MaxPrefillDue), pl.Booked, p.now())
	}
	if len(pl.Hashes) == 0 {
		p.Index.Churn(pl.Endpoint, min(pl.Churn, MaxLearntCapacity))
		return true
	}
	if pl.Forgotten {
		for _, h := range pl.Hashes[:min(len(pl.Hashes), 2)] {
			p.Index.Forget(pl.Endpoint, h)
		}
		return true
	}
	// The endpoint's index keeps the size this replica gave it (the sender's estimate of tokens differs a
	// little, and every resize copies the index); the sender's size only starts a new one.
	capacity := p.Index.Capacity(pl.Endpoint)
	if capacity == 0 {
		capacity = pl.Capacity
		if capacity <= 0 || capacity > MaxLearntCapacity {
			capacity = p.IndexBlocks
		}
	}
	p.Index.Credit(pl.Endpoint, pl.Hashes[:min(len(pl.Hashes), MaxSharedBlocks)], capacity)
	return true
}

// share publishes a placement. Three things are published: a prompt started on an endpoint whose group this
// replica's index did not hold (a new group, or a new copy of one: a spill); a held group that had faded
// towards the old end of the index's LRU (Credited.Faded), again; and, every ChurnEvery, how many blocks this
// replica's own requests added per endpoint beyond what its placements carried (Placement.Churn). Together
// they keep every replica's LRU close to the engine's cache, which sees everyone's requests: churn ages each
// index as fast as the engine's cache turns over, and renewals keep the groups in use from aging out. A group
// in steady use is renewed about once per half a turn of the cache, by whichever replica finds it fading
// first (each index also ages with what it learns), however many replicas and requests there are. Nothing
// at all is published while prompts do not come back (the sharing estimate below consistentPlacement): a
// prompt never seen again is worth no message, and a fleet of distinct prompts would otherwise publish one
// per request.
func (p *Affinity) share(best *scored, pr *prompt, capacity int) {
	hashes := make([]uint64, min(len(pr.hashes), MaxSharedBlocks))
	copy(hashes, pr.hashes)
	p.Placements.Publish(Placement{Endpoint: best.endpoint, Hashes: hashes, Capacity: capacity})
}

// shares reports whether a decision's placement is published (see share); faded is Credit's.
func (p *Affinity) shares(best *scored, pr *prompt, faded bool) bool {
	if p.Placements == nil || len(pr.hashes) == 0 {
		return false
	}
	if best.matched >= min(len(pr.hashes), rendezvousBlocks) && !faded {
		return false
	}
	b := p.sharing.Load()
	return b == 0 || math.Float64frombits(b) >= consistentPlacement
}

// forget drops a prompt's group from an endpoint in the index and tells the other replicas.
func (p *Affinity) forget(endpoint string, d Decision) {
	p.Index.Forget(endpoint, d.FirstBlock)
	p.Index.Forget(endpoint, d.GroupBlock)
	if p.Placements != nil {
		p.Placements.Publish(Placement{Endpoint: endpoint, Hashes: []uint64{d.FirstBlock, d.GroupBlock}, Forgotten: true})
	}
}

// liveSet is the set of endpoints the policy lists (for Learn), replaced whole on each policy change.
type liveSet = atomic.Pointer[map[string]bool]
