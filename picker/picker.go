// Package picker chooses the pool and replica for one request: Affinity (KV-cache affinity, load, hardware
// class, LoRA) is the gateway's picker; LeastInFlight is the simple baseline it is measured against.
package picker

import (
	"strings"
	"time"

	"github.com/infergate/infergate/contract"
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
	// Load is the picker's count of requests in flight at Endpoints[0] when it chose it (with engine metrics, the
	// engine's running batch as last read plus this gateway's sends since): the rollout gates compare the
	// arms' latencies at the same load (docs/rollouts.md).
	Load int64
	// Predicted is what SLO placement expected of the destination (zero otherwise).
	Predicted Prediction
	// Prefill, when set, is the prefill endpoint (ip:port) of a request split between it and the decode
	// endpoint Endpoints[0] (policies.Disaggregation), of pool PrefillPool; "" runs it whole.
	Prefill, PrefillPool string
	// Arm is the rollout arm the request took (ArmCandidate, ArmBaseline), "" without a rollout; ServedAs,
	// when set, is the served model name a candidate arm's body is rewritten to (a candidate that is a served
	// model name on the baseline's pools).
	Arm, ServedAs string

	churn churnBasis // what Observe needs to report the request's churn (see Affinity.ChurnEvery)
	// prefillPred is SLO placement's prediction of a split request's prefill leg at Prefill, which its
	// prefiller counts among its sends still in prefill until the first token passes.
	prefillPred Prediction
	// news and prefillNews are the ids of the long prompts the decision published at Endpoints[0] and at
	// Prefill (0: none), which the first token reports done (otherprefill.go).
	news, prefillNews uint64
}

// Score is one candidate's normalised scores (each in [0,1], one per scorer of the picker's table) and their
// weighted total, and with SLO placement its predicted timing and cost.
type Score struct {
	Endpoint string
	Total    float64
	// Parts are the scorers' scores, in the order of the picker's table (picker/scorers).
	Parts []ScorePart
	// TTFT and TPOT are predicted (0 TPOT: not yet predictable); CostUSD is the request's estimated cost there.
	TTFT, TPOT time.Duration
	CostUSD    float64
	// MeetsSLO says whether the prediction is within the request's targets (SLO placement only).
	MeetsSLO bool
	// FollowUpTTFT and GroupCostUSD, for a prompt that starts a group under SLO placement, are the predicted
	// TTFT of a follow-up (its shared prefix cached) and the group's expected cost there: the first request
	// and the expected follow-ups (see picker/group.go).
	FollowUpTTFT time.Duration
	GroupCostUSD float64
}

// ScorePart is one scorer's score of a candidate.
type ScorePart struct {
	Scorer string
	Value  float64
}

// Part is the score of the named scorer (0 when the table has none of that name).
func (s Score) Part(scorer string) float64 {
	for _, p := range s.Parts {
		if p.Scorer == scorer {
			return p.Value
		}
	}
	return 0
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
	// OutputTokens is the most output tokens the request may produce, as admission reserves them: the
	// director's bound (policies.Snapshot.OutputBound), which SLO placement prices. 0 with a Request: the picker
	// computes the same bound itself (benchmarks and tests that call it directly).
	OutputTokens int64
	// Region, when set, is the region the request is placed from instead of the gateway's own (Affinity.Region):
	// another region's Envoy whose ext_proc failed over to this gateway (docs/regions.md).
	Region string
}

// Target is what the decision is counted against for in-flight load: the chosen endpoint, or the fallback.
func (d Decision) Target(model string) string {
	if d.Fallback != nil {
		return contract.FallbackClusterName(model, d.Fallback.Name)
	}
	return d.Endpoints[0]
}

// Picker chooses a Decision for a request to a model, and learns from the requests it placed once they
// finish: learning is part of the contract, so that a picker cannot be wired without it by mistake.
type Picker interface {
	// Pick decides; when no endpoint or fallback can take the request the error is a *NoCapacity.
	Pick(snap *policies.Snapshot, in Input) (Decision, error)
	// Observe hears what the engine reported of a finished request: the prompt's tokens (to correct the
	// characters-per-token estimate) and, when the engine reports it, how many of them it served from its KV
	// cache (to correct the prefix index). Only for requests the engine answered with usage.
	Observe(d Decision, u openai.Usage)
	// ObserveTiming hears what the gateway measured of a finished request: the time from routing to its first
	// token and its time per output token, against what was predicted. Only for requests that succeeded.
	ObserveTiming(model string, d Decision, ttft, tpot time.Duration)
	// Prefilled hears that a request's prompt is no longer in its engine's prefill queue: its first token
	// passed the gateway, or it ended without one. SLO placement counts the prompts this gateway sent that are
	// still in prefill as work ahead of the next request there (see aheadTokens), and the engine's metrics do
	// not show them apart from its running batch.
	Prefilled(d Decision)
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
	// Residency, when the tenant is pinned to regions, names them: no replica or fallback inside them could
	// take the request, and none outside may.
	Residency []string
}

func (e *NoCapacity) Error() string {
	within := ""
	if e.Residency != nil {
		within = " within the tenant's residency (" + strings.Join(e.Residency, ", ") + ")"
	}
	if e.Saturated {
		return "every replica of " + e.Model + within + " is saturated"
	}
	return "no replica of " + e.Model + " is available" + within
}
