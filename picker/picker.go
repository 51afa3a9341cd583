// Package picker chooses the pool and replica for one request: Affinity (KV-cache affinity, load, hardware
// class, LoRA) is the gateway's picker; LeastInFlight is the simple baseline it is measured against.
package picker

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Decision is where one request goes: a pool, and endpoints of that pool in order of preference (the first
// is chosen; the rest are what Envoy's override_host retries next) — or, when every self-hosted endpoint is
// saturated or unavailable, the model's managed fallback.
type Decision struct {
	Pool      *policies.Pool
	Endpoints []string
	Fallback  *policies.Fallback
	// Adapter is the LoRA adapter the request asked for; upstream, the body keeps its name.
	Adapter string
	// Scores are the candidates' scores, best first, when the policy enables routing.debugScores.
	Scores []Score
	// EstimatedPromptTokens is the picker's estimate of the prompt's tokens (from its bytes), which an
	// Observer compares with the engine's count.
	EstimatedPromptTokens int
	// ExpectedCachedTokens is how many prompt tokens the picker believed the chosen endpoint holds;
	// FirstBlock and GroupBlock name the prompt's first block and its conversation group's (GroupKey), for the
	// picker to forget a belief the engine contradicts.
	ExpectedCachedTokens int
	FirstBlock           uint64
	GroupBlock           uint64
	// ServedBy is the endpoint Envoy reports it used, set on the way back when Envoy reports it: a retry may
	// have moved the request past Endpoints[0].
	ServedBy string
	// Predicted is what SLO placement expected of the destination (zero otherwise).
	Predicted Prediction
	// Arm is the rollout arm the request took (ArmCandidate, ArmBaseline), "" without a rollout; ServedAs,
	// when set, is the served model name a candidate arm's body is rewritten to (a candidate that is a served
	// model name on the baseline's pools).
	Arm, ServedAs string

	churn churnBasis // what Observe needs to report the request's churn (see Affinity.ChurnEvery)
}

// Observer is a Picker that learns from finished requests what the engine reported: the prompt's tokens
// (to correct its characters-per-token estimate) and, when the engine reports it, how many of them it served
// from its KV cache (to correct its index).
type Observer interface {
	Observe(d Decision, u openai.Usage)
}

// Score is one candidate's normalised scores (each in [0,1]) and their weighted total, and with SLO
// placement its predicted timing and cost.
type Score struct {
	Endpoint                           string
	Total, Prefix, Load, Prefill, LoRA float64
	// TTFT and TPOT are predicted (0 TPOT: not yet predictable); CostUSD is the request's estimated cost there.
	TTFT, TPOT time.Duration
	CostUSD    float64
	// MeetsSLO says whether the prediction is within the request's targets (SLO placement only).
	MeetsSLO bool
}

// Input is what one decision is about.
type Input struct {
	// Tenant's tier limits the hardware classes; nil applies no tier (benchmarks, tests).
	Tenant *policies.Tenant
	Model  *policies.Model
	// Adapter is the LoRA adapter requested, "" for the base model.
	Adapter string
	// Request is the parsed body; nil (or no prompt) skips prefix hashing.
	Request *openai.Request
	// Split, when the model has a rollout in progress, divides its traffic between baseline and candidate.
	Split *Split
	// Queueing says the gateway holds requests no endpoint has room for (spec.admission): an endpoint has room
	// while its engine's queue as last read, plus what this process sent it since (less what finished), is
	// below maxWaiting times the tenant's tier headroom; and a model with none is reported as saturated
	// instead of overflowing to its fallback, which the director tries after the wait. Under SLO placement a
	// request that no endpoint is predicted to serve in time, but that one would once its queue drained, is
	// reported as saturated too, so that it waits for a timely endpoint rather than joining a late queue.
	Queueing bool
	// Waited is how long the request has already waited in the gateway (the admission queue): SLO placement
	// judges predictions against what is left of the TTFT target.
	Waited time.Duration
}

// Target is what the decision is counted against for in-flight load: the chosen endpoint, or the fallback.
func (d Decision) Target(model string) string {
	if d.Fallback != nil {
		return contract.FallbackClusterName(model, d.Fallback.Name)
	}
	return d.Endpoints[0]
}

// Picker chooses a Decision for a request to a model. When no endpoint or fallback can take the request the
// error is a *NoCapacity.
type Picker interface {
	Pick(snap *policies.Snapshot, in Input) (Decision, error)
}

// LeastInFlight picks the endpoint with the fewest of this process's requests in flight, rotating among ties so
// an idle fleet is still spread evenly.
type LeastInFlight struct {
	InFlight *fleet.InFlight
	rotor    atomic.Uint64
}

type candidate struct {
	pool     *policies.Pool
	endpoint string
	load     int64
}

// Pick implements Picker.
func (p *LeastInFlight) Pick(snap *policies.Snapshot, in Input) (Decision, error) {
	model := in.Model
	var all []candidate
	for i := range model.Pools {
		pool := &model.Pools[i]
		if in.Tenant != nil && !snap.PoolAllowed(in.Tenant, pool) {
			continue
		}
		for _, ep := range pool.Endpoints {
			all = append(all, candidate{pool: pool, endpoint: ep})
		}
	}
	n := len(all)
	if n == 0 {
		return Decision{}, openai.NoCapacity(model.Name)
	}
	start := int(p.rotor.Add(1) % uint64(n))
	var best candidate
	found := false
	for j := 0; j < n; j++ {
		c := all[(start+j)%n]
		c.load = p.InFlight.Count(c.endpoint)
		if !found || c.load < best.load {
			best, found = c, true
		}
	}
	limit := snap.Gateway().MaxEndpointsPerDecision
	rest := make([]candidate, 0, len(best.pool.Endpoints))
	for _, ep := range best.pool.Endpoints {
		if ep != best.endpoint {
			rest = append(rest, candidate{pool: best.pool, endpoint: ep, load: p.InFlight.Count(ep)})
		}
	}
	slices.SortStableFunc(rest, func(a, b candidate) int { return int(a.load - b.load) })
	eps := make([]string, 0, min(limit, len(rest)+1))
	eps = append(eps, best.endpoint)
	for _, c := range rest {
		if len(eps) >= limit {
			break
		}
		eps = append(eps, c.endpoint)
	}
	return Decision{Pool: best.pool, Endpoints: eps, Adapter: in.Adapter}, nil
}

// Served is the model name the destination serves (the body's model is rewritten to it).
func (d Decision) Served() string {
	switch {
	case d.Fallback != nil:
		return d.Fallback.Model
	case d.ServedAs != "":
		return d.ServedAs
	case d.Adapter != "":
		return d.Adapter
	}
	return d.Pool.ServedModel
}

// NoCapacity says that no endpoint of a model can take a request and no managed fallback may: Saturated when
// replicas are busy (retry soon), otherwise none is available.
type NoCapacity struct {
	Model     string
	Saturated bool
	// RetryAfter, when set, is when the client may find room (the admission queue's drain time).
	RetryAfter time.Duration
}

func (e *NoCapacity) Error() string {
	if e.Saturated {
		return "every replica of " + e.Model + " is saturated"
	}
	return "no replica of " + e.Model + " is available"
}
