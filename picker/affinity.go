package picker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker/scorers"
	"github.com/infergate/infergate/policies"
)

// Affinity sends a prompt where its prefix is already cached, on the right hardware, without overloading
// anyone, and agrees with other gateway replicas without sharing state. It holds what outlives a request — the
// prefix index, the timing models, what it learnt of the engines' tokens and the prompts' sharing — and each
// Pick runs one decision through the pipeline (decision.go):
//
//		candidates → bound → score → place → decide
//
//	  - candidates: the endpoints of the model's pools the tenant's tier may use, less the saturated and those
//	    without fresh metrics (candidates.go);
//	  - bound: endpoints above (1+ε) × the mean load (+1; 2ε for one holding a prefix of the prompt) are out
//	    (score.go);
//	  - score: each scorer of the table (picker/scorers: prefix, load, prefill, lora), weighted by the policy's
//	    routing.weights, adds to the candidate's score (score.go);
//	  - place: the best score wins, scores within tieTolerance of it are ties, which go to the cheapest
//	    hardware; a prefix no endpoint holds is placed by placeNew (place.go); with an SLO, placeBySLO orders the
//	    candidates by predicted timing and cost instead (slo.go);
//	  - decide: the first candidate and the best others of its pool become the Decision (place.go).
//
// What it learns from finished requests is in learn.go (Observe, ObserveTiming), share.go (Learn) and
// churn.go.
type Affinity struct {
	InFlight *fleet.InFlight
	// Engines, when set, supplies engine metrics: a saturated endpoint (queue or KV cache over the policy's
	// thresholds) or one without fresh metrics is not a candidate, the engine's queue adds to its load, its
	// KV block size sets the hashing block and its num_gpu_blocks sizes its index.
	Engines EngineView
	Index   *Index
	Hasher  Hasher
	// Scorers is the scorer table (default scorers.Default, at most scorers.Max entries; set before the first
	// Pick); each one's weight is the policy's routing.weights entry of its name, or its default weight.
	Scorers []scorers.Scorer
	// IndexBlocks sizes each endpoint's index when the engine does not report num_gpu_blocks.
	IndexBlocks int
	// Placements, when set, hears every new group or new copy of one this replica places, for the other
	// gateway replicas to Learn (see Placement).
	Placements Placements
	// ChurnEvery is how often this replica reports, per endpoint, the blocks its own requests added to the
	// engine's cache that its placements did not carry (Placement.Churn): default DefaultChurnEvery; negative
	// reports none.
	ChurnEvery time.Duration
	// Metrics, when set, records what SLO placement learns of its predictions (trust, calibrated margins) and
	// the decisions it did not place by them.
	Metrics *Metrics
	// Now is the picker's clock (nil: time.Now): SLO placement times its own sends' prefills by it against the
	// engines' readings, which a simulated fleet stamps in its own time.
	Now func() time.Time
	// Region is the gateway's own region (infergate serve --region): its pools come first, the others follow
	// in its failover order (see Regions). "" ranks every region alike.
	Region string

	live  liveSet // the policy's endpoints, for Learn; nil until PolicyChanged
	churn churn

	pool    sync.Pool // []uint64 hash buffers
	lists   sync.Pool // *candidateLists: decisions' candidate lists
	pred    predictor
	scale   atomic.Uint64 // float64 bits: estimated ÷ real prompt tokens, learnt by Observe; 0 until then
	sharing atomic.Uint64 // float64 bits: share of recent prompts matching a held prefix (noteSharing); 0 until set
	shared  atomic.Uint64 // float64 bits: φ, share of a matching prompt's tokens that were held (noteShared); 0 until set
	weights atomic.Pointer[resolvedWeights]
	// failedPrefillers are prefill endpoints a split request failed on, until when they are named to no other.
	failedPrefillers sync.Map // endpoint → time.Time
	regions          regionHealth
}

// resolvedWeights are the scorer table's weights under one policy snapshot.
type resolvedWeights struct {
	snap *policies.Snapshot
	w    [scorers.Max]float64
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

// now is the time on the picker's clock.
func (p *Affinity) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
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
	endpoints := make(map[string]bool, len(live))
	for ep := range live {
		endpoints[ep] = true
	}
	p.live.Store(&endpoints)
	for i := range snap.Policy.Spec.Models {
		m := &snap.Policy.Spec.Models[i]
		for _, f := range m.Fallbacks {
			live[contract.FallbackClusterName(m.Name, f.Name)] = true
		}
	}
	p.pred.forget(func(ep string) bool { return live[ep] })
}

// Pick implements Picker: one decision through the pipeline (see Affinity).
func (p *Affinity) Pick(snap *policies.Snapshot, in Input) (Decision, error) {
	d := p.newDecision(snap, in)
	defer d.release()
	return d.run()
}

// weightsFor is each scorer's weight under snap — the policy's routing.weights entry of its name, or its
// default — looked up once per snapshot rather than per decision (the table is fixed once Pick runs).
func (p *Affinity) weightsFor(snap *policies.Snapshot, table []scorers.Scorer) *[scorers.Max]float64 {
	if c := p.weights.Load(); c != nil && c.snap == snap {
		return &c.w
	}
	c := &resolvedWeights{snap: snap}
	weights := snap.Routing().Weights
	for i, s := range table {
		w, ok := weights[s.Name]
		if !ok {
			w = s.DefaultWeight
		}
		c.w[i] = w
	}
	p.weights.Store(c)
	return &c.w
}

// table is the scorer table in force.
func (p *Affinity) table() []scorers.Scorer {
	if p.Scorers != nil {
		return p.Scorers
	}
	return scorers.Default
}

// ForStore is the Affinity a gateway runs over a policy store: endpoints a reload removes leave its index and
// its timing models, and are not learnt from other replicas. infergate serve builds it once (gateway).
func ForStore(store *policies.Store, inflight *fleet.InFlight, engines EngineView) *Affinity {
	a := NewAffinity(inflight, engines)
	a.PolicyChanged(store.Current())
	store.OnChange(a.PolicyChanged)
	return a
}
