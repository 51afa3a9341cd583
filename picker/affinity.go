package picker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Affinity sends a prompt where its prefix is already cached, on the right hardware, without overloading
// anyone, and agrees with other gateway replicas without sharing state. Normalised scorers, weighted by the
// policy's routing section, add up to each candidate's score:
//
//   - prefix: the share of the prompt's leading blocks this gateway has sent to the endpoint;
//   - load: the endpoint's requests in flight (this gateway's, or the engine's running batch plus what this
//     gateway sent since the reading when that is more: other replicas' requests are in it) plus its engine
//     queue, against the busiest;
//   - prefill: how fast the endpoint's hardware class computes the prompt's uncached tokens (τ/(t+τ), t in
//     seconds), so long uncached prompts prefer the class with faster prefill;
//   - lora: 1 where the requested adapter is loaded.
//
// Bounded load: endpoints above (1+ε) × the mean load (+1; 2ε for one holding a prefix of the prompt) are not
// candidates. The best score wins; scores within tieTolerance of it are ties, which go to the cheapest
// hardware (cost per token). A prefix no endpoint holds is placed by placeNew: while prompts share prefixes,
// at the rendezvous-hash winner of its first blocks among endpoints under a bound on conversation groups, so
// that gateway replicas that never talk to each other start a group on the same endpoint; while they do not,
// on the least loaded endpoint. With an SLO, placeBySLO orders the candidates by predicted timing and cost.
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
	// Placements, when set, hears every new group or new copy of one this replica places, for the other
	// gateway replicas to Learn (see Placement).
	Placements Placements
	// ChurnEvery is how often this replica reports, per endpoint, the blocks its own requests added to the
	// engine's cache that its placements did not carry (Placement.Churn): default DefaultChurnEvery; negative
	// reports none.
	ChurnEvery time.Duration

	live  liveSet // the policy's endpoints, for Learn; nil until PolicyChanged
	churn churn

	pool    sync.Pool // []uint64 hash buffers
	pred    predictor
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
		p.forget(d.Endpoints[0], d)
	} else if u.CachedReported && d.ExpectedCachedTokens > 0 && len(d.Endpoints) > 0 && 2*u.CachedTokens < int64(d.ExpectedCachedTokens) {
		p.forget(d.Endpoints[0], d)
	}
	p.observeChurn(d, u)
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
	load       int64 // requests in flight at the endpoint: this gateway's, or the engine's running batch plus this gateway's sends since, if more
	own        int64 // this gateway's requests in flight there (placement of unshared prompts)
	queue      int64 // the engine's waiting requests, from its metrics
	capacity   int   // the engine's KV blocks, 0 when unknown
	prefillTPS float64
	cost       float64 // USD per token of the hardware class
	speed      policies.PoolSpeed
	running    float64    // the engine's running sequences, from its metrics (SLO placement)
	since      float64    // what this gateway sent it since that reading, less what finished (SLO placement)
	pred       Prediction // SLO placement
	matched    int
	lora       float64
	kvFull     bool // the engine's KV cache is over the policy's threshold while requests wait
	s          Score
	rank       uint64 // rendezvous rank
	// lastStarted is when this gateway last sent the endpoint a request (placement of unshared prompts).
	lastStarted uint64
	groups      int  // conversation groups the index holds there (placement of shared prompts)
	agedOut     bool // the index aged this prompt's group out there (placement of shared prompts)
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

// Pick implements Picker: candidates, scores, order, decision.
// With routing.placement slo and a TTFT target for the request, candidates are predicted and placed by
// placeBySLO; otherwise by score.
func (p *Affinity) Pick(snap *policies.Snapshot, in Input) (Decision, error) {
	targets, slo := sloTargets(snap, in)
	cands, saturated, unavailable, engineBlock := p.candidates(snap, in, slo)
	if len(cands) == 0 {
		return overflow(in.Model, in, saturated, unavailable)
	}
	pr := p.hashPrompt(in, engineBlock)
	defer p.releasePrompt(&pr)
	if in.Split != nil {
		return p.pickArm(snap, in, cands, pr, targets, slo, saturated, unavailable)
	}
	return p.place(snap, in, cands, pr, targets, slo, saturated, unavailable)
}

// pickArm places a rolled-out model's request on its arm's pools. A candidate arm that cannot take it (no
// endpoint, or all full so that placement would overflow) leaves it to the baseline: the candidate's share is
// a ceiling, never a reason to refuse or to pay the managed API.
func (p *Affinity) pickArm(snap *policies.Snapshot, in Input, cands []scored, pr prompt, targets policies.Targets, slo bool, saturated, unavailable int) (Decision, error) {
	sp := in.Split
	group := sp.Conversation
	if group == 0 && len(pr.hashes) > 0 {
		group = GroupKey(pr.hashes)
	}
	if group == 0 {
		group = sp.Ungrouped
	}
	arm := sp.arm(in.Model.Name, group)
	if kept := sp.inArmOnly(cands, arm); len(kept) > 0 {
		d, err := p.place(snap, in, kept, pr, targets, slo, saturated, unavailable)
		if arm == ArmBaseline || sp.Force != "" || (err == nil && d.Fallback == nil) {
			return sp.annotate(d, arm), err
		}
	} else if sp.Force == ArmBaseline {
		return overflow(in.Model, in, saturated, unavailable)
	}
	base := sp.inArmOnly(cands, ArmBaseline)
	if len(base) == 0 {
		return overflow(in.Model, in, saturated, unavailable)
	}
	d, err := p.place(snap, in, base, pr, targets, slo, saturated, unavailable)
	return sp.annotate(d, ArmBaseline), err
}

// place decides among the candidates for a hashed prompt.
func (p *Affinity) place(snap *policies.Snapshot, in Input, cands []scored, pr prompt, targets policies.Targets, slo bool, saturated, unavailable int) (Decision, error) {
	w := p.weightsFor(snap.Routing())
	eligible, anyMatch, kvFull := p.eligible(cands, pr, w, slo)
	if len(eligible) == 0 {
		return overflow(in.Model, in, saturated+kvFull, unavailable)
	}
	if slo {
		return p.placeBySLO(snap, in, eligible, cands, pr, w, targets)
	}
	return p.decide(snap, in, p.order(eligible, cands, pr, anyMatch, w), pr), nil
}
