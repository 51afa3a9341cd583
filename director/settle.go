package director

import (
	"time"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/quota"
)

// Settlement is the final account of one routed request, handed to the quota and billing stages exactly once.
type Settlement struct {
	RequestID string
	Tenant    string
	Model     string
	Pool      string
	Endpoint  string
	Status    int    // upstream HTTP status; 0 when the response never started
	Result    string // completed, upstream_error or aborted
	Usage     openai.Usage
	Reported  bool // Usage came from the engine rather than an estimate
	CostUSD   float64
	Started   time.Time
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
	// Served is the endpoint Envoy reports it sent the request to ("" when it did not say).
	Served string
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
	d.opts.InFlight.Done(rt.target)
	m.InFlight.Dec()

	result := "completed"
	switch {
	case o.Aborted:
		result = "aborted"
	case o.Status >= 400 || o.Status == 0:
		result = "upstream_error"
	}
	usage := o.Usage
	if !o.Reported {
		reason := result
		if result == "completed" {
			reason = "no_usage_in_response"
		}
		m.UsageEstimated.WithLabelValues(reason).Inc()
		usage = openai.Usage{}
		if result != "upstream_error" {
			// Charge the prompt sent and, for a stream cut short, the output chunks it carried; a client cannot
			// dodge output charges by disconnecting before usage.
			usage.PromptTokens = rt.prompt
			if rt.stream {
				usage.CompletionTokens = o.ContentEvents
			}
		}
	}
	model := rt.Model
	if clamped, cut := usage.Clamp(model.ContextTokens); cut {
		d.opts.Logger.Warn("upstream reported more tokens than the model's context holds; charged at the context size",
			"request_id", rt.requestID, "model", model.Name, "prompt_tokens", usage.PromptTokens,
			"completion_tokens", usage.CompletionTokens, "context_tokens", model.ContextTokens)
		usage = clamped
	}
	cost := quota.CostUSD(model, usage.PromptTokens, usage.CompletionTokens)
	tenant := rt.tenant.Name
	m.Responses.WithLabelValues(result).Inc()
	m.Tokens.WithLabelValues(tenant, model.Name, "prompt").Add(float64(usage.PromptTokens))
	m.Tokens.WithLabelValues(tenant, model.Name, "completion").Add(float64(usage.CompletionTokens))
	m.Tokens.WithLabelValues(tenant, model.Name, "cached").Add(float64(usage.CachedTokens))
	m.CostUSD.WithLabelValues(tenant, model.Name).Add(cost)
	endpoint := rt.target
	if o.Served != "" && rt.Decision.Fallback == nil {
		endpoint = o.Served
	}
	st := Settlement{
		RequestID: rt.requestID, Tenant: tenant, Model: model.Name, Pool: rt.Pool(), Endpoint: endpoint,
		Status: o.Status, Result: result, Usage: usage, Reported: o.Reported, CostUSD: cost, Started: rt.started,
	}
	d.opts.Logger.Debug("request settled", "request_id", st.RequestID, "tenant", tenant, "model", model.Name,
		"result", result, "prompt_tokens", usage.PromptTokens, "completion_tokens", usage.CompletionTokens,
		"cached_tokens", usage.CachedTokens, "usage_reported", o.Reported)
	if rt.ticket != nil {
		d.opts.Admission.Settle(rt.ticket, usage.Total(), quota.MicroUSD(model, usage.PromptTokens, usage.CompletionTokens))
	}
	if obs, ok := d.opts.Picker.(picker.Observer); ok && o.Reported && rt.Decision.Fallback == nil {
		dec := rt.Decision
		dec.ServedBy = o.Served
		obs.Observe(dec, usage)
	}
	for _, ob := range d.opts.Observers {
		ob.Settled(st)
	}
	return st
}
