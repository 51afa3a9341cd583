package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

const exposition = `# TYPE infergate_tenant_requests_total counter
infergate_tenant_requests_total{model="m",outcome="ok",tenant="acme",tier="enterprise"} 90
infergate_tenant_requests_total{model="m",outcome="saturated",tenant="acme",tier="enterprise"} 10
infergate_tenant_requests_total{model="m",outcome="quota",tenant="acme",tier="enterprise"} 50
infergate_tenant_requests_total{model="m",outcome="ok",tenant="initech",tier="free"} 4
# TYPE infergate_tenant_good_requests_total counter
infergate_tenant_good_requests_total{model="m",tenant="acme",tier="enterprise"} 80
infergate_tenant_good_requests_total{model="m",tenant="initech",tier="free"} 4
# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="a",tier="enterprise",le="0.1"} 50
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="a",tier="enterprise",le="0.2"} 50
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="a",tier="enterprise",le="+Inf"} 50
gen_ai_server_time_to_first_token_seconds_sum{gen_ai_request_model="m",pool="a",tier="enterprise"} 2
gen_ai_server_time_to_first_token_seconds_count{gen_ai_request_model="m",pool="a",tier="enterprise"} 50
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="b",tier="enterprise",le="0.1"} 0
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="b",tier="enterprise",le="0.2"} 50
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="b",tier="enterprise",le="+Inf"} 50
gen_ai_server_time_to_first_token_seconds_sum{gen_ai_request_model="m",pool="b",tier="enterprise"} 7
gen_ai_server_time_to_first_token_seconds_count{gen_ai_request_model="m",pool="b",tier="enterprise"} 50
# TYPE infergate_slo_ttft_target_seconds gauge
infergate_slo_ttft_target_seconds{gen_ai_request_model="m",tier="enterprise"} 0.2
infergate_slo_ttft_target_seconds{gen_ai_request_model="n",tier="enterprise"} 0.5
infergate_tenant_requests_total{model="n",outcome="ok",tenant="acme",tier="enterprise"} 5
`

func TestGoodputFromMetrics(t *testing.T) {
	rows, err := goodputFrom(strings.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	// A row per tier and model: each model is judged against its own target in the tier.
	if len(rows) != 3 || rows[0].tier != "enterprise" || rows[0].model != "m" || rows[1].model != "n" || rows[2].tier != "free" {
		t.Fatalf("rows %+v", rows)
	}
	if n := rows[1]; n.ttftTarget != 0.5 || n.requests != 5 || !math.IsNaN(n.ttftP95) {
		t.Errorf("model n's row %+v: want its own 500 ms target", n)
	}
	e := rows[0]
	if e.requests != 100 || e.good != 80 {
		t.Errorf("enterprise %v good of %v eligible, want 80 of 100 (quota refusals are the tenant's)", e.good, e.requests)
	}
	// 100 observations, half ≤ 0.1 and half in (0.1, 0.2]: p95 is 0.1 + 0.1 × 45/50.
	if math.Abs(e.ttftP95-0.19) > 1e-9 || e.ttftTarget != 0.2 || !math.IsNaN(e.tpotP95) {
		t.Errorf("enterprise TTFT p95 %v target %v, TPOT %v", e.ttftP95, e.ttftTarget, e.tpotP95)
	}
	var b strings.Builder
	renderGoodput(&b, rows)
	if !strings.Contains(b.String(), "80.0%") || !strings.Contains(b.String(), "190 ms / 200 ms") {
		t.Errorf("table:\n%s", b.String())
	}
}

// The pool-down summary counts, for llama requests, who served them while the pool was down and after.
func TestPoolDownSummary(t *testing.T) {
	sc, err := scenarioFor("pool-down")
	if err != nil {
		t.Fatal(err)
	}
	s := time.Second
	samples := []sample{
		{at: 3 * s, model: "llama-3.3-70b", replica: "llama70b-h200-0"},  // before
		{at: 8 * s, model: "llama-70b", replica: "together"},             // during, managed
		{at: 9 * s, model: "llama-3.3-70b", replica: "together"},         // during, managed
		{at: 9 * s, model: "llama-3.3-70b", tenant: "initech"},           // forbidden: not counted
		{at: 10 * s, model: "qwen2.5-7b", replica: "qwen7b-l40s-0"},      // another model
		{at: 11 * s, model: "llama-3.3-70b", replica: ""},                // during, failed
		{at: 22 * s, model: "llama-3.3-70b", replica: "llama70b-l40s-1"}, // after recovery
	}
	got := sc.summary(samples)
	for _, want := range []string{"2 llama requests were served by the managed API", "1 failed", "1 were served by the pool again"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary %q lacks %q", got, want)
		}
	}
	if _, err := scenarioFor("nope"); err == nil {
		t.Error("an unknown scenario is accepted")
	}
	for _, name := range scenarios {
		if sc, err := scenarioFor(name); err != nil || sc.status() == "" && name != "steady" {
			t.Errorf("scenario %s: %v", name, err)
		}
	}
}
