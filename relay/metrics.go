package relay

import "github.com/prometheus/client_golang/prometheus"

// Metrics show which replica scrapes for the others and how often the others had to scrape themselves.
type Metrics struct {
	leader   prometheus.Gauge
	rounds   *prometheus.CounterVec
	received *prometheus.CounterVec
	dropped  prometheus.Counter
}

// NewMetrics registers the relay's series with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "infergate_fleet_relay_leader",
			Help: "1 while this gateway holds the relay lease: it scrapes the engines and publishes the readings to the other replicas."}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_fleet_relay_rounds_total",
			Help: "Scrape rounds by how this gateway got them: relayed (another replica's readings), scraped_leader, scraped_relay_late (no relayed round for two intervals)."}, []string{"source"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_fleet_relay_messages_total",
			Help: "Relay messages this gateway heard, by result (accepted, partial: missing engines this gateway scrapes, own, malformed; with a message key: unsigned, forged, stale)."}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_fleet_relay_dropped_total",
			Help: "Rounds this gateway scraped as the relay leader but did not publish (superseded by a newer round, or Redis failed)."}),
	}
	if reg != nil {
		reg.MustRegister(m.leader, m.rounds, m.received, m.dropped)
	}
	return m
}
