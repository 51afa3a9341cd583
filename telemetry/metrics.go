package telemetry

import (
	"cmp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
)

// Label names follow the OpenTelemetry GenAI semantic conventions v1.40.0 (the semconv package tracing.go
// uses) as Prometheus spells them (gen_ai.request.model → gen_ai_request_model): the gen_ai_* histograms carry
// the required gen_ai.operation.name and gen_ai.provider.name, the conditionally required
// gen_ai.request.model and error.type (on errors), and the recommended gen_ai.response.model; the rest are
// infergate's. Histograms carry no tenant: tenants are counted, not bucketed, to keep the series few.
var (
	requestLabels = []string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model",
		"pool", "hardware_class", "tier"}
	tenantLabels = []string{"tenant", "tier", "model"}
	poolLabels   = []string{"model", "pool", "hardware_class"}
)

// Buckets for the latency histograms: the GenAI conventions' advice, with more resolution where SLOs sit.
var (
	ttftBuckets = []float64{.01, .025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 7.5, 10, 20, 40}
	tpotBuckets = []float64{.005, .01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .2, .3, .5, .75, 1, 2.5}
	e2eBuckets  = []float64{.01, .05, .1, .25, .5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
	// The conventions' advice for gen_ai.client.token.usage: powers of four.
	tokenBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304}
)

// Metrics records every settled request in Prometheus series: latency histograms by model, pool, hardware
// class and tier; good and total requests, tokens per tenant; prompt and cached tokens per pool. It is a
// director.SettleObserver.
type Metrics struct {
	ttft, tpot, itl, e2e, tokens *prometheus.HistogramVec
	queue                        *prometheus.HistogramVec
	requests, good               *prometheus.CounterVec
	poolTokens                   *prometheus.CounterVec
	// split and splitTTFT follow requests split between a prefill and a decode endpoint (docs/disaggregation.md).
	split     *prometheus.CounterVec
	splitTTFT *prometheus.HistogramVec
	// regions counts where a regional gateway's requests were served (docs/regions.md).
	regions *prometheus.CounterVec
	// Region is the gateway's own region (infergate serve --region); "" counts no region series.
	Region string

	series sync.Map // seriesKey → *requestSeries
}

// NewMetrics creates the series and registers them on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		ttft: hist("gen_ai_server_time_to_first_token_seconds",
			"Time from the request's headers at the gateway to the first response chunk carrying generated content.",
			ttftBuckets, requestLabels...),
		tpot: hist("gen_ai_server_time_per_output_token_seconds",
			"Mean time per output token after the first, of streamed responses seen chunk by chunk.",
			tpotBuckets, requestLabels...),
		itl: hist("infergate_inter_token_latency_max_seconds",
			"Longest gap between two response chunks carrying content, per request.", tpotBuckets, requestLabels...),
		e2e: hist("gen_ai_server_request_duration_seconds",
			"Time from the request's headers to the end of its response, by error_type (empty on success).",
			e2eBuckets, append(append([]string{}, requestLabels...), "error_type")...),
		tokens: hist("gen_ai_client_token_usage", "Tokens per request, by gen_ai_token_type (input, output).",
			tokenBuckets, append(append([]string{}, requestLabels...), "gen_ai_token_type")...),
		queue: hist("infergate_queue_duration_seconds", "Time requests waited in the gateway before they were routed.",
			ttftBuckets, "gen_ai_request_model", "tier"),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_tenant_requests_total",
			Help: "Requests that reached routing, by tenant, tier, model and outcome (ok, client_error, quota, saturated, unavailable, upstream_5xx, reset, timeout)."},
			append(append([]string{}, tenantLabels...), "outcome")),
		good: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_tenant_good_requests_total",
			Help: "Requests that completed successfully within their SLO, by tenant, tier and model."}, tenantLabels),
		poolTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_pool_tokens_total",
			Help: "Tokens settled per pool, by kind (prompt, cached, completion); cached ÷ prompt is the pool's prefix-cache hit ratio."},
			append(append([]string{}, poolLabels...), "kind")),
	}
	m.split = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_disaggregated_requests_total",
		Help: "Requests split between a prefill and a decode endpoint, by model, prefill_pool, decode_pool and result: split (served so), prefill_failed (the prefill leg failed and the decode replica's engine served it whole), error (it failed)."},
		[]string{"model", "prefill_pool", "decode_pool", "result"})
	m.splitTTFT = hist("infergate_disaggregated_ttft_seconds",
		"TTFT of requests served split: the prefill leg, the KV cache's transfer and the decoder's first step (the sidecar's own spans, under the request's trace, time each leg).",
		ttftBuckets, "model", "prefill_pool", "decode_pool")
	m.regions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_region_requests_total",
		Help: "Requests a gateway with a region routed, by model, from (the gateway's region) and to (the region of the pool or managed API that served it; outside: a managed API outside every region). to ≠ from while the home region is healthy is traffic paid twice: the round trip and the other region's capacity."},
		[]string{"model", "from", "to"})
	if reg != nil {
		reg.MustRegister(m.ttft, m.tpot, m.itl, m.e2e, m.tokens, m.queue, m.requests, m.good, m.poolTokens, m.split, m.splitTTFT, m.regions)
	}
	return m
}

// seriesKey is what a request's series are chosen by.
type seriesKey struct {
	op                                                 openai.Endpoint
	provider, tenant, tier, model, served, pool, class string
}

// requestSeries are one key's series, looked up once.
type requestSeries struct {
	ttft, tpot, itl, e2eOK, input, output, queue prometheus.Observer
	ok, good                                     prometheus.Counter
	prompt, cached, completion                   prometheus.Counter
}

func (m *Metrics) seriesFor(k seriesKey) *requestSeries {
	if s, ok := m.series.Load(k); ok {
		return s.(*requestSeries)
	}
	lv := []string{operation(k.op), k.provider, k.model, k.served, k.pool, k.class, k.tier}
	s := &requestSeries{
		ttft: m.ttft.WithLabelValues(lv...), tpot: m.tpot.WithLabelValues(lv...), itl: m.itl.WithLabelValues(lv...),
		e2eOK:  m.e2e.WithLabelValues(append(lv, "")...),
		input:  m.tokens.WithLabelValues(append(lv, "input")...),
		output: m.tokens.WithLabelValues(append(lv, "output")...),
		queue:  m.queue.WithLabelValues(k.model, k.tier),
		ok:     m.requests.WithLabelValues(k.tenant, k.tier, k.model, director.OutcomeOK),
		good:   m.good.WithLabelValues(k.tenant, k.tier, k.model),
	}
	if k.pool != "" {
		s.prompt = m.poolTokens.WithLabelValues(k.model, k.pool, k.class, "prompt")
		s.cached = m.poolTokens.WithLabelValues(k.model, k.pool, k.class, "cached")
		s.completion = m.poolTokens.WithLabelValues(k.model, k.pool, k.class, "completion")
	}
	actual, _ := m.series.LoadOrStore(k, s)
	return actual.(*requestSeries)
}

// Settled implements director.SettleObserver.
func (m *Metrics) Settled(st director.Settlement) {
	if !st.Routed {
		m.requests.WithLabelValues(st.Tenant, st.Tier, st.Model, st.Outcome).Inc()
		return
	}
	s := m.seriesFor(seriesKey{st.Operation, st.Provider, st.Tenant, st.Tier, st.Model, st.ServedModel, st.Pool, st.HardwareClass})
	t := st.Timing
	s.queue.Observe(t.Queued.Seconds())
	if st.Outcome == director.OutcomeOK {
		s.ok.Inc()
		s.e2eOK.Observe(t.E2E.Seconds())
	} else {
		m.requests.WithLabelValues(st.Tenant, st.Tier, st.Model, st.Outcome).Inc()
		m.e2e.WithLabelValues(operation(st.Operation), st.Provider, st.Model, st.ServedModel, st.Pool, st.HardwareClass, st.Tier,
			st.Outcome).Observe(t.E2E.Seconds())
	}
	if st.Good {
		s.good.Inc()
	}
	if t.TTFT > 0 {
		s.ttft.Observe(t.TTFT.Seconds())
	}
	if t.TPOT > 0 {
		s.tpot.Observe(t.TPOT.Seconds())
	}
	if t.MaxITL > 0 {
		s.itl.Observe(t.MaxITL.Seconds())
	}
	if st.Prefill != "" {
		m.splitSettled(st)
	}
	if m.Region != "" {
		m.regions.WithLabelValues(st.Model, cmp.Or(st.From, m.Region), cmp.Or(st.Region, "outside")).Inc()
	}
	u := st.Usage
	s.input.Observe(float64(u.PromptTokens))
	if st.Operation != openai.EndpointEmbeddings {
		s.output.Observe(float64(u.CompletionTokens))
	}
	if s.prompt != nil {
		s.prompt.Add(float64(u.PromptTokens))
		s.cached.Add(float64(u.CachedTokens))
		s.completion.Add(float64(u.CompletionTokens))
	}
}

// splitSettled counts a split request by what became of it, and times the TTFT of one served split.
func (m *Metrics) splitSettled(st director.Settlement) {
	result := "error"
	switch {
	case st.PrefillFailed:
		result = "prefill_failed"
	case st.Outcome == director.OutcomeOK:
		result = "split"
		if st.Timing.TTFT > 0 {
			m.splitTTFT.WithLabelValues(st.Model, st.PrefillPool, st.Pool).Observe(st.Timing.TTFT.Seconds())
		}
	}
	m.split.WithLabelValues(st.Model, st.PrefillPool, st.Pool, result).Inc()
}
