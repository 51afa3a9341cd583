package picker

import (
	"cmp"
	"slices"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker/scorers"
	"github.com/infergate/infergate/policies"
)

// scored is one candidate endpoint as the stages fill it in: what the candidates stage read of it, what the
// index holds of the prompt there (bound), its scores (score) and, under SLO placement, its prediction.
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
	running    float64   // the engine's running sequences, from its metrics (SLO placement)
	since      float64   // what this gateway sent it since that reading, less what finished (SLO placement)
	readAt     time.Time // when the engine's reading was taken (SLO placement)
	kvUtil     float64   // the engine's KV cache usage, 0..1 (SLO placement)
	// prompt and cached are the engine's counters of prompt tokens and of those its cache held, since it
	// started, when it keeps both (counted; SLO placement, engineshare.go).
	prompt, cached float64
	counted        bool
	// kvAwaited is how many running sequences must finish before the engine's KV cache holds the request
	// (SLO placement; see kvAwaited).
	kvAwaited float64
	// adapterLoaded: the engine reports the requested LoRA adapter loaded.
	adapterLoaded bool
	kvFull        bool // the engine's KV cache is over the policy's threshold while requests wait

	matched int    // leading prompt blocks the index holds there (bound)
	rank    uint64 // rendezvous rank (bound)
	// region is the pool's region's place in the gateway's region order (0: its own; see Regions), rtt the round
	// trip to it.
	region int
	rtt    time.Duration
	// parts are the table's scores, total their weighted sum, fit that of the hardware-fit scorers (score).
	parts      [scorers.Max]float64
	total, fit float64
	pred       Prediction   // SLO placement
	grp        groupFigures // SLO placement of a prompt that starts a group
	meets      bool         // pred is within the request's targets (SLO placement)
	// harmsLegs: placed there, the request would prefill there and make awaited decode legs late (pred.legsLate,
	// SLO placement; see prefillsHere).
	harmsLegs   bool
	lastStarted uint64 // when this gateway last sent the endpoint a request (placement of unshared prompts)
	groups      int    // conversation groups the index holds there (placement of shared prompts)
	agedOut     bool   // the index aged this prompt's group out there (placement of shared prompts)
}

// candidates is the first stage: it lists the endpoints that may take the request (d.all) — the pools of the
// model the tenant's tier allows, less the endpoints whose engine is saturated (queue at the policy's
// threshold) or unheard of (no fresh metrics), each with its load, queue, KV state, hardware speed and cost. It
// counts what it left out, for overflow, and returns the engine's KV block size when one reports it (0
// otherwise). Under SLO placement each candidate also carries the engine's running batch and what this
// gateway sent it since.
func (d *decision) candidates() (blockTokens int) {
	p, snap, in, slo, routing := d.p, d.snap, &d.in, d.slo, &d.routing
	cands := d.all[:0]
	var saturated, unavailable int
	var tierRoom room // read only with the admission queue
	if in.Queueing {
		tierRoom = room{headroom: snap.QueueClass(in.Tenant).Headroom, above: snap.ReservedAbove(in.Tenant, in.Model),
			replicas: float64(max(1, snap.QuotaSettings().GatewayReplicas))}
	}
	from := cmp.Or(in.Region, p.Region)
	order := snap.RegionOrder(from)
	var counts regionCounts
	for i := range in.Model.Pools {
		pool := &in.Model.Pools[i]
		if !pool.ServesWhole() || in.Tenant != nil && !snap.PoolAllowed(in.Tenant, pool) {
			continue // a prefill-only pool takes no whole request
		}
		region, used := regionOf(order, pool)
		if !used {
			continue // a region this gateway does not fail over to
		}
		speed, rtt := snap.Speed(pool), snap.RegionRTT(from, pool.Region)
		for _, ep := range pool.Endpoints {
			c := p.newScored(pool, speed, ep)
			c.region, c.rtt = region, rtt
			counts.seen[region]++
			if p.Engines != nil {
				m, fresh := p.Engines.Metrics(ep)
				if fresh {
					counts.up[region]++
				}
				switch {
				case !fresh:
					unavailable++ // stale metrics count as saturated: no routing on old numbers
					continue
				case !p.hasRoom(ep, m, pool, routing.MaxWaiting, tierRoom, in.Queueing):
					saturated++
					continue
				}
				// A full KV cache that already makes requests wait rules out prompts it does not hold (decided
				// when scoring): a cache hit needs few new blocks, a miss needs them all.
				c.kvFull = m.KVUtil >= routing.MaxKVUtilisation && m.Waiting > 0
				c.queue, c.capacity = int64(m.Waiting), m.NumBlocks
				since := p.InFlight.SinceReading(ep, m.At)
				// The engine's running batch holds every gateway replica's requests; with this gateway's sends
				// since the reading it is the load all replicas see alike, where this gateway's own in-flight
				// count is a share of it.
				c.load = max(c.load, int64(m.Running)+since)
				if slo {
					c.readForSLO(m, since)
				}
				if blockTokens == 0 {
					blockTokens = m.BlockSize
				}
				c.adapterLoaded = in.Adapter != "" && slices.Contains(m.LoRAs, in.Adapter)
			}
			if slo && p.Engines == nil {
				c.since = float64(c.load) // no engine metrics: this gateway's own requests are the queue
			}
			cands = append(cands, c)
		}
	}
	d.all, d.saturated, d.unavailable = cands, saturated, unavailable
	if p.Engines == nil {
		counts.up = counts.seen
	}
	d.regional = len(order) > 1
	d.holdBack(order, &counts)
	return blockTokens
}

// newScored is the candidate ep of pool, its load this gateway's requests in flight there.
func (p *Affinity) newScored(pool *policies.Pool, speed policies.PoolSpeed, ep string) scored {
	own := p.InFlight.Count(ep)
	return scored{pool: pool, endpoint: ep, load: own, own: own, prefillTPS: speed.PrefillTokensPerSecond,
		cost: speed.CostPerToken(), speed: speed}
}

// readForSLO keeps what SLO placement predicts from in an engine's reading m: its running batch, when it was
// read, its KV cache's usage, and this gateway's sends since.
func (c *scored) readForSLO(m fleet.EngineMetrics, since int64) {
	c.running, c.since, c.readAt, c.kvUtil = m.Running, float64(since), m.At, m.KVUtil
	// An engine without a cache counter (or without hits yet) would read every prompt token as computed.
	c.prompt, c.cached, c.counted = m.PromptTokens, m.CachedPromptTokens, m.PromptTokens > 0 && m.CachedPromptTokens > 0
}

// overflow decides for a model none of whose endpoints can take a request: its managed fallback if the policy
// allows it for this condition (never for a LoRA adapter, which the provider does not have, nor outside the
// tenant's residency), otherwise NoCapacity; a saturated model whose requests queue is NoCapacity, for the
// director to queue the request.
func overflow(snap *policies.Snapshot, in Input, saturated, unavailable int) (Decision, error) {
	cond := policies.WhenUnavailable
	if saturated > 0 {
		cond = policies.WhenSaturated
		if in.Queueing {
			return Decision{}, noCapacity(snap, in, true) // the queue first
		}
	}
	if dec, ok := fallbackFor(snap, in, cond); ok {
		return dec, nil
	}
	return Decision{}, noCapacity(snap, in, saturated > 0)
}

// noCapacity is the NoCapacity of a request, naming the residency that bounded it.
func noCapacity(snap *policies.Snapshot, in Input, saturated bool) *NoCapacity {
	return &NoCapacity{Model: in.Model.Name, Saturated: saturated, Residency: snap.Residency(in.Tenant)}
}

// SaturatedFallback is the managed fallback a saturated model's overflow may go to, if the policy names one
// that the tenant's residency allows (the admission queue's degradation once a request cannot start in time).
func SaturatedFallback(snap *policies.Snapshot, in Input) (Decision, bool) {
	return fallbackFor(snap, in, policies.WhenSaturated)
}

func fallbackFor(snap *policies.Snapshot, in Input, cond string) (Decision, bool) {
	model := in.Model
	for i := range model.Fallbacks {
		f := &model.Fallbacks[i]
		if in.Adapter == "" && slices.Contains(f.When, cond) && snap.FallbackAllowed(in.Tenant, f) {
			return Decision{Fallback: f}, true
		}
	}
	return Decision{}, false
}

// room is what hasRoom reads of a queued request's tier: its headroom and the reserves of the tiers above it,
// and how many gateway replicas fill the same engines.
type room struct {
	headroom float64
	above    []policies.Reservation
	replicas float64
}

// hasRoom says whether an endpoint may take a request: while its engine's queue is below maxWaiting. With the
// admission queue, the engine's load is what it last reported plus what the gateway replicas sent it since
// (less what finished) — this process's own count times the replicas (spec.quotas.gatewayReplicas), which fill
// the same engines alike — and a tier may fill it to headroom × (the pool's maxConcurrency + maxWaiting)
// running and waiting requests, less what the reserves of higher tiers hold free (reserved), or, when the pool
// does not say its batch size, to headroom × maxWaiting waiting ones: lower tiers leave room that every
// gateway replica sees in the same engine metrics.
func (p *Affinity) hasRoom(ep string, m fleet.EngineMetrics, pool *policies.Pool, maxWaiting int, tier room, queueing bool) bool {
	if !queueing {
		return m.Waiting < float64(maxWaiting)
	}
	since := tier.replicas * float64(p.InFlight.SinceReading(ep, m.At))
	if slots := pool.MaxConcurrency; slots > 0 {
		capacity := float64(slots + maxWaiting)
		limit := min(tier.headroom*capacity, capacity-p.reserved(ep, pool, capacity, tier))
		return max(0, m.Running+m.Waiting+since) < limit
	}
	return max(0, m.Waiting+since) < tier.headroom*float64(maxWaiting)
}

// reserved is how many of an endpoint's capacity slots the reserves of the tiers above a request's keep free:
// each reserve's share of them less what that tier's requests hold there, this process's count times the
// gateway replicas (which send it alike), on a pool the reserving tier may use. A tier that holds its share,
// or more, keeps nothing free: its further requests take their turn in the queue.
func (p *Affinity) reserved(ep string, pool *policies.Pool, capacity float64, tier room) float64 {
	var free float64
	for _, r := range tier.above {
		if r.Covers(pool) {
			free += max(0, r.Share*capacity-tier.replicas*float64(p.InFlight.Held(ep, r.Tier)))
		}
	}
	return free
}
