package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

// FleetCollector publishes, at scrape time, what the live policy and the last engine scrape say: the SLO
// targets (so alerts compare latencies with them), each pool's hourly cost (so cost per output token is a
// query), and each endpoint's engine gauges and in-flight count as the router last saw them, so a dashboard
// shows why a decision went where it did. It costs the request path nothing.
type FleetCollector struct {
	Policies *policies.Store
	Engines  picker.EngineView // nil: no engine gauges
	InFlight *fleet.InFlight   // nil: no in-flight gauge
}

var (
	ttftTargetDesc = prometheus.NewDesc("infergate_slo_ttft_target_seconds",
		"The policy's time-to-first-token target for a tier's requests to a model.", []string{"tier", "gen_ai_request_model"}, nil)
	tpotTargetDesc = prometheus.NewDesc("infergate_slo_tpot_target_seconds",
		"The policy's time-per-output-token target for a tier's requests to a model.", []string{"tier", "gen_ai_request_model"}, nil)
	objectiveDesc = prometheus.NewDesc("infergate_slo_objective_ratio",
		"The share of a tier's requests that must be good.", []string{"tier"}, nil)
	poolCostDesc = prometheus.NewDesc("infergate_pool_hourly_cost_usd",
		"A pool's replicas × its hardware class's cost per hour: with completion tokens, its cost per output token.", poolLabels, nil)
	endpointLabels = []string{"model", "pool", "endpoint"}
	waitingDesc    = prometheus.NewDesc("infergate_endpoint_waiting_requests",
		"Requests waiting in the engine's queue, as last scraped (absent when the reading is stale).", endpointLabels, nil)
	runningDesc = prometheus.NewDesc("infergate_endpoint_running_requests",
		"Requests in the engine's running batch, as last scraped.", endpointLabels, nil)
	kvDesc = prometheus.NewDesc("infergate_endpoint_kv_cache_usage_ratio",
		"The engine's KV-cache usage (0..1), as last scraped.", endpointLabels, nil)
	inflightDesc = prometheus.NewDesc("infergate_endpoint_inflight_requests",
		"Requests this gateway has sent to the endpoint that have not finished.", endpointLabels, nil)
	kvCapacityDesc = prometheus.NewDesc("infergate_endpoint_kv_cache_capacity_tokens",
		"Tokens the engine's KV cache holds (blocks × block size, from its cache config), as last scraped; with the usage ratio, the KV wall `infergate plan --live` reads.", endpointLabels, nil)
)

// Describe implements prometheus.Collector.
func (c *FleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{ttftTargetDesc, tpotTargetDesc, objectiveDesc, poolCostDesc, waitingDesc,
		runningDesc, kvDesc, inflightDesc, kvCapacityDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *FleetCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.Policies.Current()
	objectives := map[string]bool{}
	for _, e := range snap.SLOTable() {
		if e.Targets.TTFT > 0 {
			ch <- prometheus.MustNewConstMetric(ttftTargetDesc, prometheus.GaugeValue, e.Targets.TTFT.Seconds(), e.Tier, e.Model.Name)
		}
		if e.Targets.TPOT > 0 {
			ch <- prometheus.MustNewConstMetric(tpotTargetDesc, prometheus.GaugeValue, e.Targets.TPOT.Seconds(), e.Tier, e.Model.Name)
		}
		if !objectives[e.Tier] {
			objectives[e.Tier] = true
			ch <- prometheus.MustNewConstMetric(objectiveDesc, prometheus.GaugeValue, e.Targets.Objective, e.Tier)
		}
	}
	classes := snap.Policy.Spec.HardwareClasses
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			cost := float64(len(p.Endpoints)) * classes[p.HardwareClass].CostPerHour
			ch <- prometheus.MustNewConstMetric(poolCostDesc, prometheus.GaugeValue, cost, m.Name, p.Name, p.HardwareClass)
			for _, ep := range p.Endpoints {
				c.endpoint(ch, m.Name, p.Name, ep)
			}
		}
	}
}

func (c *FleetCollector) endpoint(ch chan<- prometheus.Metric, model, pool, ep string) {
	if c.InFlight != nil {
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(c.InFlight.Count(ep)), model, pool, ep)
	}
	if c.Engines == nil {
		return
	}
	em, fresh := c.Engines.Metrics(ep)
	if !fresh {
		return
	}
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, em.Waiting, model, pool, ep)
	ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, em.Running, model, pool, ep)
	ch <- prometheus.MustNewConstMetric(kvDesc, prometheus.GaugeValue, em.KVUtil, model, pool, ep)
	if em.NumBlocks > 0 && em.BlockSize > 0 {
		ch <- prometheus.MustNewConstMetric(kvCapacityDesc, prometheus.GaugeValue, float64(em.NumBlocks)*float64(em.BlockSize), model, pool, ep)
	}
}
