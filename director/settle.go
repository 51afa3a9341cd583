package director

import (
	"context"
	"log/slog"
	"time"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
)

// Settlement is the final account of one request that reached routing, handed to the quota and billing stages
// exactly once when it was routed, and to the settle observers (metrics, traces, audit) in every case.
type Settlement struct {
	RequestID string
	Tenant    string
	Tier      string // policies.TierOf the tenant
	Model     string // canonical
	// ServedModel is the name the engine or provider was asked for (gen_ai.response.model).
	ServedModel string
	// Provider is the GenAI conventions' gen_ai.provider.name of where a routed request went: the pool's
	// engine (vllm, sglang, trtllm) or the managed API's fallback name ("" when not routed).
	Provider      string
	Pool          string
	HardwareClass string // the pool's, or ManagedClass for a managed API
	Endpoint      string
	// Prefill is the prefill endpoint of a request split between it and Endpoint (docs/disaggregation.md), and
	// PrefillPool its pool; PrefillFailed says the prefill leg failed and the decode replica's engine, past its
	// sidecar, served the request whole (Endpoint is then that engine).
	Prefill, PrefillPool string
	PrefillFailed        bool
	// Region is where the request was served when the policy has regions (docs/regions.md): its pool's region,
	// or its managed API's ("" for one outside every region).
	Region string
	// From is the region of the Envoy that asked when it is another region's (Request.EdgeRegion); "" is the
	// gateway's own.
	From      string
	Operation openai.Endpoint
	Stream    bool
	// Routed is false for a request Route refused; such a settlement has no usage, status or endpoint.
	Routed   bool
	Status   int    // upstream HTTP status; 0 when the response never started
	Result   string // completed, upstream_error or aborted (routed requests)
	Outcome  string // the class: one of the Outcome* constants
	Usage    openai.Usage
	Reported bool // Usage came from the engine rather than an estimate
	// FinishReason is why the engine stopped generating (openai.Finish*), "" when the gateway did not see it.
	FinishReason string
	CostUSD      float64
	Started      time.Time
	Timing       Timing
	// Targets is the SLO the request was judged against; Good says whether it met it.
	Targets policies.Targets
	Good    bool
	// PrefixShare is the share of the prompt the picker expected the chosen endpoint to hold in KV cache.
	PrefixShare float64
	// PromptDigest and OutputDigest are keyed hex digests (HMAC-SHA256) of the prompt field as sent and of the
	// generated text, when the protocol stage computed them (for the audit log), under the key DigestKey
	// names; TraceID names the request's trace.
	PromptDigest, OutputDigest, DigestKey, TraceID string
	// Arm is the rollout arm the request took (picker.ArmCandidate, picker.ArmBaseline), "" without a rollout;
	// ArmChosen says a tester chose it (x-infergate-rollout), so the gates leave the request out.
	Arm       string
	ArmChosen bool
	// Load is the picker's count of requests in flight at the endpoint when it chose it (picker.Decision.Load),
	// by which the rollout gates match the arms' latencies.
	Load int64
	// Shadow says the request is a copy sent to a rollout's candidate in its shadow phase (director.Shadows):
	// never returned to a client and never charged; only the rollout's gates, the shadow metrics and the audit
	// log (marked) see it.
	Shadow bool
}

// ManagedClass is the hardware class reported for requests served by a managed API.
const ManagedClass = "managed"

// Outcome classes: how a request ended, as SLO reports and alerts group them.
const (
	OutcomeOK          = "ok"
	OutcomeClientError = "client_error" // the request was wrong (4xx): the tenant's doing
	OutcomeQuota       = "quota"        // over the tenant's quota: the tenant's doing
	OutcomeSaturated   = "saturated"    // every replica busy (429 from the gateway or the engine)
	OutcomeUnavailable = "unavailable"  // no replica, or the quota service down and failing closed
	OutcomeUpstream5xx = "upstream_5xx"
	OutcomeReset       = "reset"   // the stream ended before the response did (reset, client gone)
	OutcomeTimeout     = "timeout" // Envoy gave up waiting (408, 504)
)

// Timing is what the gateway measured of one request, from its request headers.
type Timing struct {
	// TTFT is the time to the first response chunk carrying generated content (0 when none came).
	TTFT time.Duration
	// TPOT is the mean time per output token after the first: (last content − first content) ÷ (completion
	// tokens − 1); 0 with fewer than two tokens or when the response was not seen chunk by chunk.
	TPOT time.Duration
	// MaxITL is the longest gap between two chunks carrying content.
	MaxITL time.Duration
	E2E    time.Duration
	// Queued is the time the request waited in the gateway before it was routed.
	Queued time.Duration
	// Chunked is true when the response was seen chunk by chunk as it arrived, so TTFT is the real time to first
	// token; otherwise (BUFFERED response mode, non-streaming responses) TTFT is when the whole body arrived.
	Chunked bool
}

// Outcome is how a routed request's response ended, as the protocol stage saw it.
type Outcome struct {
	Status  int  // upstream HTTP status; 0 when no response started
	Aborted bool // the stream ended before the response did (client gone, reset, timeout)
	// Usage is the engine's report, when Reported.
	Usage    openai.Usage
	Reported bool
	// ContentEvents counts a stream's events with choices: about one output token each, the estimate when
	// usage never came.
	ContentEvents int64
	// BodySeen says the response body passed the protocol stage whole enough to count its output (its
	// response body mode is not NONE, and a JSON body fit what it holds); OutputTextBytes are the generated
	// text's bytes of a JSON body that reported no usage.
	BodySeen        bool
	OutputTextBytes int64
	// FinishReason is the answer's finish reason (openai.Finish*), "" when none was seen.
	FinishReason string
	// AnswerText is the generated text, kept only when the route PairsAnswer (at most MaxPairedAnswer bytes).
	AnswerText []byte
	// Served is the endpoint Envoy reports it sent the request to ("" when it did not say).
	Served string
	// FirstContent and LastContent are when the first and last chunks carrying generated content passed (zero
	// when none did), MaxGap the longest wait between two of them, Ended when the response ended.
	FirstContent, LastContent, Ended time.Time
	MaxGap                           time.Duration
	Chunked                          bool // see Timing.Chunked
	// The digests, their key and the trace id, when the protocol stage has them (see Settlement).
	PromptDigest, OutputDigest, DigestKey, TraceID string
}

// Settle accounts for a routed request once — later calls return the zero Settlement: the engine's usage
// when it reported it (clamped to the model's context), otherwise an estimate; its cost; the quota
// correction; what the picker learns; and the observers.
func (d *Director) Settle(rt *Route, o Outcome) Settlement {
	if rt == nil || rt.settled {
		return Settlement{}
	}
	rt.settled = true
	m := d.opts.Metrics
	endpoint := rt.inFlight.target
	d.uncount(&rt.inFlight, rt.Model.Name)

	result := "completed"
	switch {
	case o.Aborted:
		result = "aborted"
	case o.Status >= 400 || o.Status == 0:
		result = "upstream_error"
	}
	usage := d.settledUsage(rt, o, result)
	model := rt.Model
	cost := quota.CostUSD(model, usage.PromptTokens, usage.CompletionTokens)
	tenant := rt.tenant.Name
	m.Responses.WithLabelValues(result).Inc()
	m.Tokens.WithLabelValues(tenant, model.Name, "prompt").Add(float64(usage.PromptTokens))
	m.Tokens.WithLabelValues(tenant, model.Name, "completion").Add(float64(usage.CompletionTokens))
	m.Tokens.WithLabelValues(tenant, model.Name, "cached").Add(float64(usage.CachedTokens))
	m.CostUSD.WithLabelValues(tenant, model.Name).Add(cost)
	if o.Served != "" && rt.Decision.Fallback == nil {
		endpoint = o.Served
	}
	st := rt.settlement()
	st.Routed, st.Endpoint, st.Status, st.Result = true, endpoint, o.Status, result
	st.Outcome = outcomeOf(o)
	st.Usage, st.Reported, st.CostUSD, st.FinishReason = usage, o.Reported, cost, o.FinishReason
	st.Timing = timingOf(rt, o, usage)
	st.PrefillFailed = rt.retriedPastSidecar(o.Served)
	st.Good = good(st)
	if !rt.placed.IsZero() && st.Outcome == OutcomeOK && o.Chunked && !o.FirstContent.IsZero() && rt.Decision.Fallback == nil {
		// From placement, not arrival: the time before the queue (the body, quotas) is already behind a
		// waiting request, and counting it again would shorten every wait by it.
		d.starts.observe(model.Name, o.FirstContent.Sub(rt.placed), d.opts.Now())
	}
	st.PromptDigest, st.OutputDigest, st.DigestKey, st.TraceID = o.PromptDigest, o.OutputDigest, o.DigestKey, o.TraceID
	if rt.pair && d.opts.Shadows != nil {
		d.opts.Shadows.Answered(rt.requestID, st.Outcome == OutcomeOK, o.AnswerText)
	}
	if est := rt.Decision.EstimatedPromptTokens; est > 0 {
		st.PrefixShare = min(1, float64(rt.Decision.ExpectedCachedTokens)/float64(est))
	}
	if d.opts.Logger.Enabled(context.Background(), slog.LevelDebug) { // the arguments cost allocations even when discarded
		d.opts.Logger.Debug("request settled", "request_id", st.RequestID, "tenant", tenant, "model", model.Name,
			"result", result, "prompt_tokens", usage.PromptTokens, "completion_tokens", usage.CompletionTokens,
			"cached_tokens", usage.CachedTokens, "usage_reported", o.Reported)
	}
	d.warnings.log(d.opts.Logger, st)
	if rt.ticket != nil {
		d.opts.Admission.Settle(rt.ticket, usage.Total(), quota.MicroUSD(model, usage.PromptTokens, usage.CompletionTokens))
	}
	d.learn(rt, o, st, usage)
	d.notify(st)
	return st
}

// FirstToken tells the picker that a routed request's first token passed the gateway: its prompt has left the
// engine's prefill queue, which the next request there no longer waits behind. The data plane calls it when
// the first chunk with generated content passes, before the client has it.
func (d *Director) FirstToken(rt *Route) { d.opts.Picker.Prefilled(rt.Decision) }

// learn tells the picker what the request showed: that its prefill is over, however it ended; its timing when
// it succeeded and was seen chunk by chunk; the engine's usage when the engine reported it.
func (d *Director) learn(rt *Route, o Outcome, st Settlement, usage openai.Usage) {
	dec := rt.Decision
	dec.ServedBy = o.Served
	prefillFailed := dec.Prefill != "" && (st.Outcome == OutcomeUpstream5xx || st.Outcome == OutcomeReset)
	if st.PrefillFailed {
		// Envoy retried the split request on its decode replica's engine, past the sidecar: the prefill leg
		// failed, and the same engine (whose cache the picker tracks under the sidecar's address) served it whole.
		dec.ServedBy, prefillFailed = dec.Endpoints[0], true
	}
	d.opts.Picker.Prefilled(dec)
	if st.Outcome == OutcomeOK && o.Chunked && st.Timing.TTFT > 0 && !prefillFailed { // a failed leg's time is not the endpoint's
		d.opts.Picker.ObserveTiming(rt.Model.Name, dec, st.Timing.TTFT-st.Timing.Queued, st.Timing.TPOT)
	}
	if o.Reported && dec.Fallback == nil {
		d.opts.Picker.Observe(dec, usage)
	}
	if prefillFailed {
		if pf, ok := d.opts.Picker.(prefillLearner); ok {
			// A split request that failed, or was retried past its sidecar: llm-d's sidecar answers a failed
			// prefill leg's error as its own, so the prefiller is the likelier culprit (a failed decode leg
			// costs it a rest it did not need).
			pf.PrefillFailed(dec.Prefill)
		}
	}
}

// retriedPastSidecar says whether Envoy served a split request on its decode replica's engine, past the
// sidecar (policies.Pool.EngineEndpoints): what a failed prefill leg leads to.
func (rt *Route) retriedPastSidecar(served string) bool {
	dec := &rt.Decision
	return served != "" && dec.Prefill != "" && dec.Pool != nil && len(dec.Endpoints) > 0 &&
		served == dec.Pool.EngineEndpoint(dec.Endpoints[0])
}

// prefillLearner is a picker that hears a split request's prefill leg failed (picker.Affinity).
type prefillLearner interface{ PrefillFailed(endpoint string) }

// settledUsage is what the request is charged for: the engine's report, clamped to the model's context, or
// an estimate when it reported none.
func (d *Director) settledUsage(rt *Route, o Outcome, result string) openai.Usage {
	usage := o.Usage
	if !o.Reported {
		reason := result
		if result == "completed" {
			reason = "no_usage_in_response"
		}
		d.opts.Metrics.UsageEstimated.WithLabelValues(reason).Inc()
		usage = openai.Usage{}
		if result != "upstream_error" {
			// Charge the prompt sent and the output delivered; a client cannot dodge output charges by
			// disconnecting before usage.
			usage.PromptTokens, usage.CompletionTokens = rt.prompt, deliveredOutput(rt, o)
		}
	}
	model := rt.Model
	if clamped, cut := usage.Clamp(model.ContextTokens, rt.choices); cut {
		d.opts.Logger.Warn("upstream reported more tokens than the model's context holds; charged at the context size",
			"request_id", rt.requestID, "model", model.Name, "prompt_tokens", usage.PromptTokens,
			"completion_tokens", usage.CompletionTokens, "context_tokens", model.ContextTokens)
		usage = clamped
	}
	return usage
}

// deliveredOutput is the output charged for a response that reported no usage: what it carried, where the
// gateway saw it — a stream's events with content (about one token each), a JSON body's generated text at four
// bytes a token (as prompts are estimated) — and the output bound admission reserved where it did not see the
// body, so that a response the gateway cannot count is never charged nothing.
func deliveredOutput(rt *Route, o Outcome) int64 {
	switch {
	case !o.BodySeen:
		return rt.output
	case rt.stream:
		return o.ContentEvents
	}
	return (o.OutputTextBytes + 3) / 4
}

// notify hands a settlement to every observer.
func (d *Director) notify(st Settlement) {
	for _, ob := range d.opts.Observers {
		ob.Settled(st)
	}
}

// settlement fills what the route knows of the request.
func (rt *Route) settlement() Settlement {
	st := Settlement{RequestID: rt.requestID, Tenant: rt.tenant.Name, Tier: policies.TierOf(rt.tenant), Model: rt.Model.Name,
		Operation: rt.endpoint, Stream: rt.stream, Started: rt.started, Targets: rt.targets, From: rt.from}
	if rt.Decision.Pool != nil || rt.Decision.Fallback != nil {
		st.Pool, st.ServedModel, st.Arm, st.Prefill = rt.Pool(), rt.Decision.Served(), rt.Decision.Arm, rt.Decision.Prefill
		st.PrefillPool, st.Load = rt.Decision.PrefillPool, rt.Decision.Load
		st.ArmChosen = st.Arm != "" && rt.split.Force != ""
		st.HardwareClass = ManagedClass
		if f := rt.Decision.Fallback; f != nil {
			st.Provider, st.Region = f.Name, f.Region
		}
		if p := rt.Decision.Pool; p != nil && rt.Decision.Fallback == nil {
			st.HardwareClass, st.Provider, st.Region = p.HardwareClass, p.Engine, p.Region
		}
	}
	return st
}

// outcomeOf classes a routed request's end.
func outcomeOf(o Outcome) string {
	switch {
	case o.Status == 408 || o.Status == 504:
		return OutcomeTimeout
	case o.Aborted:
		return OutcomeReset
	case o.Status == 429:
		return OutcomeSaturated
	case o.Status == 0 || o.Status >= 500:
		return OutcomeUpstream5xx
	case o.Status >= 400:
		return OutcomeClientError
	}
	return OutcomeOK
}

// timingOf turns the protocol stage's instants into the request's latencies.
func timingOf(rt *Route, o Outcome, u openai.Usage) Timing {
	t := Timing{MaxITL: o.MaxGap, Chunked: o.Chunked, Queued: rt.queued}
	if !o.Ended.IsZero() && !rt.started.IsZero() {
		t.E2E = max(0, o.Ended.Sub(rt.started))
	}
	if !o.FirstContent.IsZero() && !rt.started.IsZero() {
		t.TTFT = max(0, o.FirstContent.Sub(rt.started))
		if o.Chunked && u.CompletionTokens > 1 {
			t.TPOT = max(0, o.LastContent.Sub(o.FirstContent)) / time.Duration(u.CompletionTokens-1)
		}
	}
	return t
}

// Good says whether a settled request met its SLO (for settlements made outside the director: shadow copies).
func Good(st Settlement) bool { return good(st) }

// good says whether a settled request met its SLO: it succeeded and, when its response was seen chunk by
// chunk as a stream, its TTFT and TPOT are within the targets; otherwise its end-to-end time is within
// ttft + tpot × (completion tokens − 1). A target of zero does not constrain.
func good(st Settlement) bool {
	if st.Outcome != OutcomeOK {
		return false
	}
	tg, t := st.Targets, st.Timing
	if st.Stream && t.Chunked {
		return (tg.TTFT == 0 || t.TTFT <= tg.TTFT) && (tg.TPOT == 0 || t.TPOT <= tg.TPOT)
	}
	if tg.TTFT == 0 || (tg.TPOT == 0 && st.Usage.CompletionTokens > 1) {
		return true // an unconstrained part makes the budget unbounded
	}
	budget := tg.TTFT
	if n := st.Usage.CompletionTokens; n > 1 {
		budget = time.Duration(quota.AddTokens(int64(budget), int64(satMul(tg.TPOT, n-1))))
	}
	return t.E2E <= budget
}

func satMul(d time.Duration, n int64) time.Duration {
	if n > 0 && d > time.Duration(1<<63-1)/time.Duration(n) {
		return time.Duration(1<<63 - 1)
	}
	return d * time.Duration(n)
}
