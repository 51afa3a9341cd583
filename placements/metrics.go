package placements

import "github.com/prometheus/client_golang/prometheus"

// Metrics count the placements this replica shared and heard, so that a dashboard shows whether the
// replicas agree (received learnt ≈ the other replicas' published) or drop news.
type Metrics struct {
	published prometheus.Counter
	dropped   *prometheus.CounterVec
	received  *prometheus.CounterVec
}

// NewMetrics registers the counters with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_placements_published_total",
			Help: "Messages this gateway published to the other replicas: placements (new conversation groups or copies, groups renewed as they faded, evictions found), long prompts sent and churn reports."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_placements_dropped_total",
			Help: "Placements this gateway could not publish, by reason (queue_full, redis)."}, []string{"reason"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_placements_received_total",
			Help: "Placement messages this gateway heard, by result (learnt, forgotten, prefill, prefill_done, churn: one per endpoint of a churn report; own, unknown_endpoint, malformed; with a message key: unsigned, forged, stale)."}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.dropped, m.received)
	}
	return m
}
