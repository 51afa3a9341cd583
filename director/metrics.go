package director

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the processor's Prometheus series. Envoy records no ext_proc processing time of its own, so the
// decision latency measured here (from request headers to the routing answer, body streaming included) is
// the only place an operator can see what the gateway adds.
type Metrics struct {
	Requests      *prometheus.CounterVec   // by outcome: routed, models_list, or the error code of a rejection
	Responses     *prometheus.CounterVec   // by result: completed, upstream_error, aborted
	Decision      *prometheus.HistogramVec // seconds from request headers to routing decision, by body mode
	InFlight      prometheus.Gauge
	Tokens        *prometheus.CounterVec // by tenant, model, kind (prompt, completion, cached)
	CostUSD       *prometheus.CounterVec // by tenant, model
	ActiveStreams prometheus.Gauge
	// BodyBytesHeld is what request bodies not routed yet hold (extproc's body budget).
	BodyBytesHeld  prometheus.Gauge
	UsageEstimated *prometheus.CounterVec // settlements without engine-reported usage, by reason
}

// NewMetrics creates the series and registers them on reg (skipped when reg is nil, for tests that build many
// servers).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_requests_total",
			Help: "Requests seen by the ext_proc server, by outcome (routed, models_list, or the error code returned).",
		}, []string{"outcome"}),
		Responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_responses_total",
			Help: "Routed requests settled, by how they ended (completed, upstream_error, aborted).",
		}, []string{"result"}),
		Decision: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "infergate_decision_duration_seconds",
			Help:    "Time from request headers to the routing answer, including body streaming, by request body mode.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"body_mode"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infergate_inflight_requests",
			Help: "Routed requests whose response has not finished.",
		}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_tokens_total",
			Help: "Tokens settled, by tenant, model and kind (prompt, completion, cached).",
		}, []string{"tenant", "model", "kind"}),
		CostUSD: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_cost_usd_total",
			Help: "Spend charged at policy prices, by tenant and model.",
		}, []string{"tenant", "model"}),
		ActiveStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infergate_extproc_active_streams",
			Help: "Open ext_proc streams (one per HTTP request in Envoy).",
		}),
		BodyBytesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infergate_extproc_request_body_bytes_held",
			Help: "Request body bytes held by requests not routed yet; bounded by spec.gateway.maxBodyBytesInFlight.",
		}),
		UsageEstimated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_usage_estimated_total",
			Help: "Settlements that used an estimate because the engine reported no usage, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.Responses, m.Decision, m.InFlight, m.Tokens, m.CostUSD, m.ActiveStreams,
			m.UsageEstimated, m.BodyBytesHeld)
	}
	return m
}
