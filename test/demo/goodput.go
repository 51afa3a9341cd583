package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// tierRow is one tier's goodput on one model as infergate's own /metrics reports it since it started: a model's
// requests are judged against its own targets (a per-model override of the tier's), so each pair is a row.
type tierRow struct {
	tier, model        string
	requests, good     float64 // eligible requests (not the tenant's own client errors or quota refusals), good ones
	ttftP95, tpotP95   float64 // seconds; NaN without observations
	ttftTarget, tpotTg float64 // the policy's targets (seconds), 0 when none
}

// scrapeGoodput reads infergate's metrics endpoint.
func scrapeGoodput(url string) ([]tierRow, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return goodputFrom(resp.Body)
}

func goodputFrom(r io.Reader) ([]tierRow, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	rows := map[rowKey]*tierRow{}
	row := func(k rowKey) *tierRow {
		if rows[k] == nil {
			rows[k] = &tierRow{tier: k.tier, model: k.model, ttftP95: math.NaN(), tpotP95: math.NaN()}
		}
		return rows[k]
	}
	for _, m := range fams["infergate_tenant_requests_total"].GetMetric() {
		if o := labelOf(m, "outcome"); o != "client_error" && o != "quota" {
			row(rowKey{labelOf(m, "tier"), labelOf(m, "model")}).requests += m.GetCounter().GetValue()
		}
	}
	for _, m := range fams["infergate_tenant_good_requests_total"].GetMetric() {
		row(rowKey{labelOf(m, "tier"), labelOf(m, "model")}).good += m.GetCounter().GetValue()
	}
	for k, h := range mergeByTier(fams["gen_ai_server_time_to_first_token_seconds"]) {
		row(k).ttftP95 = quantile(0.95, h)
	}
	for k, h := range mergeByTier(fams["gen_ai_server_time_per_output_token_seconds"]) {
		row(k).tpotP95 = quantile(0.95, h)
	}
	// Each row shows its own model's targets in its tier.
	for name, set := range map[string]func(*tierRow, float64){
		"infergate_slo_ttft_target_seconds": func(r *tierRow, v float64) { r.ttftTarget = v },
		"infergate_slo_tpot_target_seconds": func(r *tierRow, v float64) { r.tpotTg = v },
	} {
		for _, m := range fams[name].GetMetric() {
			if r := rows[rowKey{labelOf(m, "tier"), labelOf(m, "gen_ai_request_model")}]; r != nil {
				set(r, m.GetGauge().GetValue())
			}
		}
	}
	out := make([]tierRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].tier < out[j].tier || out[i].tier == out[j].tier && out[i].model < out[j].model
	})
	return out, nil
}

// rowKey is a table row's tier and model.
type rowKey struct{ tier, model string }

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// bucket is a cumulative histogram bucket.
type bucket struct{ upper, count float64 }

// mergeByTier sums a histogram family's series per tier and requested model.
func mergeByTier(f *dto.MetricFamily) map[rowKey][]bucket {
	sums := map[rowKey]map[float64]float64{}
	for _, m := range f.GetMetric() {
		tier := rowKey{labelOf(m, "tier"), labelOf(m, "gen_ai_request_model")}
		if sums[tier] == nil {
			sums[tier] = map[float64]float64{}
		}
		for _, b := range m.GetHistogram().GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // +Inf is the sample count, added once below
				sums[tier][b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		sums[tier][math.Inf(1)] += float64(m.GetHistogram().GetSampleCount())
	}
	out := map[rowKey][]bucket{}
	for tier, byUpper := range sums {
		var bs []bucket
		for u, c := range byUpper {
			bs = append(bs, bucket{u, c})
		}
		slices.SortFunc(bs, func(a, b bucket) int {
			switch {
			case a.upper < b.upper:
				return -1
			case a.upper > b.upper:
				return 1
			}
			return 0
		})
		out[tier] = bs
	}
	return out
}

// quantile interpolates within cumulative buckets as Prometheus' histogram_quantile does.
func quantile(q float64, bs []bucket) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	lower, prev := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.upper, 1) {
				return lower // the highest finite bound, as Prometheus answers
			}
			if b.count == prev {
				return b.upper
			}
			return lower + (b.upper-lower)*(rank-prev)/(b.count-prev)
		}
		lower, prev = b.upper, b.count
	}
	return lower
}

// renderGoodput prints the goodput table, a row per tier and model.
func renderGoodput(w io.Writer, rows []tierRow) {
	fmt.Fprintf(w, "\n%-11s %-14s %6s %9s %18s %18s   (infergate's own metrics)\n", "TIER", "MODEL", "REQS", "GOODPUT", "TTFT p95 / SLO", "TPOT p95 / SLO")
	for _, r := range rows {
		good := "-"
		if r.requests > 0 {
			good = fmt.Sprintf("%.1f%%", 100*r.good/r.requests)
		}
		fmt.Fprintf(w, "%-11s %-14s %6.0f %9s %18s %18s\n", r.tier, r.model, r.requests, good, vsTarget(r.ttftP95, r.ttftTarget), vsTarget(r.tpotP95, r.tpotTg))
	}
}

func vsTarget(v, target float64) string {
	got := "-"
	if !math.IsNaN(v) {
		got = fmt.Sprintf("%.0f ms", v*1000)
	}
	if target > 0 {
		return fmt.Sprintf("%s / %.0f ms", got, target*1000)
	}
	return got
}

// goodput prints the per-tier table from infergate's /metrics, or why it cannot.
func goodput(w io.Writer, metricsAddr string) {
	rows, err := scrapeGoodput("http://" + metricsAddr + "/metrics")
	if err != nil {
		fmt.Fprintf(w, "\n(goodput unavailable: %v)\n", err)
		return
	}
	renderGoodput(w, rows)
}

// telemetryWhere says where the demo's metrics, traces and audit log go.
func telemetryWhere(metricsAddr, auditDir string) string {
	traces := "off (set OTEL_EXPORTER_OTLP_ENDPOINT=http://host:4317 before make demo to export them over OTLP)"
	if ep := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")); ep != "" {
		traces = "OTLP to " + ep
	}
	return fmt.Sprintf("telemetry: Prometheus metrics at http://%s/metrics (goodput: infergate_tenant_good_requests_total; "+
		"TTFT: gen_ai_server_time_to_first_token_seconds), traces %s, audit log in %s (one JSON line per request, digests only)\n",
		metricsAddr, traces, auditDir)
}
