package picker

import "github.com/prometheus/client_golang/prometheus"

// Metrics are SLO placement's own series: what it has learnt of its predictions and when it stopped relying on
// them, so that an operator sees it fall back rather than guess. Labels are bounded by the policy (models,
// pools).
type Metrics struct {
	// Trusted is 1 while a model's predictions are relied on, 0 while placement ranks by affinity instead.
	Trusted *prometheus.GaugeVec
	// Margin is each pool's effective share of the TTFT target a prediction may use (routing.sloMargin × the
	// pool's calibration factor).
	Margin *prometheus.GaugeVec
	// Decisions counts the SLO decisions that did not place by prediction: untrusted (ranked by affinity) and
	// overload (refused or sent to the saturated fallback, since every endpoint would have served it late).
	Decisions *prometheus.CounterVec
}

// NewMetrics registers the series with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Trusted: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_slo_placement_trusted",
			Help: "1 while SLO placement relies on a model's TTFT predictions, 0 while it ranks by affinity because they proved wrong."},
			[]string{"model"}),
		Margin: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_slo_placement_margin",
			Help: "Share of the TTFT target a pool's prediction may use, as calibrated from its observed misses."},
			[]string{"model", "pool"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_slo_placement_fallbacks_total",
			Help: "SLO decisions not placed by prediction: untrusted (ranked by affinity) or overload (every endpoint would serve it late)."},
			[]string{"model", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Trusted, m.Margin, m.Decisions)
	}
	return m
}

func (m *Metrics) trusted(model string, ok bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	m.Trusted.WithLabelValues(model).Set(v)
}

func (m *Metrics) margin(key poolKey, margin float64) {
	if m != nil {
		m.Margin.WithLabelValues(key.model, key.pool).Set(margin)
	}
}

func (m *Metrics) fellBack(model, reason string) {
	if m != nil {
		m.Decisions.WithLabelValues(model, reason).Inc()
	}
}
