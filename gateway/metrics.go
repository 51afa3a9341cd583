package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/policies"
)

// registerPolicyMetrics exposes reload results, so an alert can fire when a bad policy is being refused and
// the fleet is running on an older one.
func registerPolicyMetrics(reg prometheus.Registerer, store *policies.Store) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "infergate_policy_reloads_total", Help: "Policy reload attempts, by result (ok, rejected).",
			ConstLabels: prometheus.Labels{"result": "ok"},
		}, func() float64 { ok, _, _ := store.ReloadStats(); return float64(ok) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "infergate_policy_reloads_total", Help: "Policy reload attempts, by result (ok, rejected).",
			ConstLabels: prometheus.Labels{"result": "rejected"},
		}, func() float64 { _, failed, _ := store.ReloadStats(); return float64(failed) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_policy_last_reload_success",
			Help: "1 if the last policy load succeeded, 0 if the last attempt was rejected and an older policy is live.",
		}, func() float64 {
			if _, _, ok := store.ReloadStats(); ok {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_policy_loaded_timestamp_seconds",
			Help: "When the live policy was loaded (Unix seconds).",
		}, func() float64 { return float64(store.Current().LoadedAt.Unix()) }),
	)
}
