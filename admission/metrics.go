package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the admission queue's series, labelled by model and tier (both bounded by the policy).
type Metrics struct {
	Requests *prometheus.GaugeVec
	Bytes    *prometheus.GaugeVec
	Wait     *prometheus.HistogramVec
	// Results counts how waits ended and what the director made of an expired or refused one: started,
	// degraded (to a cheaper model or the managed API), shed, aborted, removed.
	Results *prometheus.CounterVec
}

// NewMetrics registers the series with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_admission_queue_requests",
			Help: "Requests waiting in the admission queue for an endpoint with room."}, []string{"model", "tier"}),
		Bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_admission_queue_bytes",
			Help: "Request body bytes held by the admission queue."}, []string{"model", "tier"}),
		Wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "infergate_admission_wait_seconds",
			Help:    "Time requests spent in the admission queue, by how the wait ended.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"model", "tier", "result"}),
		Results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_admission_results_total",
			Help: "Requests that met a full fleet, by what became of them (started, degraded, shed, aborted, removed) and why."},
			[]string{"model", "tier", "result", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.Bytes, m.Wait, m.Results)
	}
	return m
}

func (m *Metrics) enqueued(e *Entry) {
	m.Requests.WithLabelValues(e.Model, e.Class.Tier).Inc()
	m.Bytes.WithLabelValues(e.Model, e.Class.Tier).Add(float64(e.Bytes))
}

// finished records a wait's end; one that never joined the queue (refused at the door) has no gauges to undo.
func (m *Metrics) finished(e *Entry, r Result, waited time.Duration) {
	if e.band != nil {
		m.Requests.WithLabelValues(e.Model, e.Class.Tier).Dec()
		m.Bytes.WithLabelValues(e.Model, e.Class.Tier).Sub(float64(e.Bytes))
	}
	m.Wait.WithLabelValues(e.Model, e.Class.Tier, r.String()).Observe(waited.Seconds())
	switch r {
	case Started:
		m.Result(e.Model, e.Class.Tier, "started", "room")
	case Aborted:
		m.Result(e.Model, e.Class.Tier, "aborted", "client")
	case Removed:
		m.Result(e.Model, e.Class.Tier, "removed", "reload")
	}
}

// Result counts one request's fate; the director reports the degraded and shed ones.
func (m *Metrics) Result(model, tier, result, reason string) {
	m.Results.WithLabelValues(model, tier, result, reason).Inc()
}
