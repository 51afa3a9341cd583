package telemetry

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// exposition renders a registry in the Prometheus text format, as /metrics serves it.
func exposition(t *testing.T, reg *prometheus.Registry) []byte {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// parse reads the text format back with prometheus/common's parser, as Prometheus would.
func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("exposition does not parse: %v", err)
	}
	return fams
}

func find(fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		match := true
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if match {
			return m
		}
	}
	return nil
}

// sample is one series' expected value.
type sample struct {
	name   string
	labels map[string]string
	want   float64
}

// checkSamples compares each sample with the series' value (a counter's or a gauge's).
func checkSamples(t *testing.T, fams map[string]*dto.MetricFamily, samples []sample) {
	t.Helper()
	for _, c := range samples {
		m := find(fams, c.name, c.labels)
		if m == nil {
			t.Errorf("no %s%v", c.name, c.labels)
			continue
		}
		if got := m.GetCounter().GetValue() + m.GetGauge().GetValue(); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

func TestMetricsFromSettlements(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	ms := time.Millisecond
	base := director.Settlement{Routed: true, Tenant: "acme", Tier: "enterprise", Model: "llama", ServedModel: "meta/llama",
		Pool: "h200", HardwareClass: "h200", Operation: openai.EndpointChat, Stream: true, Provider: "vllm"}
	ok := base
	ok.Outcome, ok.Good = director.OutcomeOK, true
	ok.Usage = openai.Usage{PromptTokens: 1000, CachedTokens: 600, CompletionTokens: 50}
	ok.Timing = director.Timing{TTFT: 80 * ms, TPOT: 20 * ms, MaxITL: 40 * ms, E2E: 1100 * ms, Chunked: true}
	slow := ok
	slow.Good, slow.Timing.TTFT = false, 400*ms
	failed := base
	failed.Outcome, failed.Timing.E2E = director.OutcomeUpstream5xx, 30*ms
	refused := director.Settlement{Tenant: "acme", Tier: "enterprise", Model: "llama", Outcome: director.OutcomeSaturated}
	for _, st := range []director.Settlement{ok, slow, failed, refused} {
		m.Settled(st)
	}
	fams := parse(t, exposition(t, reg))
	checkSamples(t, fams, []sample{
		{"infergate_tenant_requests_total", map[string]string{"tenant": "acme", "outcome": "ok"}, 2},
		{"infergate_tenant_requests_total", map[string]string{"tenant": "acme", "outcome": "upstream_5xx"}, 1},
		{"infergate_tenant_requests_total", map[string]string{"tenant": "acme", "outcome": "saturated"}, 1},
		{"infergate_tenant_good_requests_total", map[string]string{"tenant": "acme", "tier": "enterprise"}, 1},
		{"infergate_pool_tokens_total", map[string]string{"pool": "h200", "kind": "prompt"}, 2000},
		{"infergate_pool_tokens_total", map[string]string{"pool": "h200", "kind": "cached"}, 1200},
	})
	// The GenAI conventions' required attributes are labels: the operation and the provider (the pool's engine).
	ttft := find(fams, "gen_ai_server_time_to_first_token_seconds", map[string]string{"gen_ai_operation_name": "chat",
		"gen_ai_provider_name": "vllm", "gen_ai_request_model": "llama", "gen_ai_response_model": "meta/llama", "pool": "h200",
		"hardware_class": "h200", "tier": "enterprise"})
	if h := ttft.GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() < 0.479 || h.GetSampleSum() > 0.481 {
		t.Errorf("TTFT histogram count %d sum %v, want 2 and 0.48", h.GetSampleCount(), h.GetSampleSum())
	}
	if e := find(fams, "gen_ai_server_request_duration_seconds", map[string]string{"error_type": "upstream_5xx",
		"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm"}); e.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("failed request's duration not recorded under its error type")
	}
	if u := find(fams, "gen_ai_client_token_usage", map[string]string{"gen_ai_token_type": "output"}); u.GetHistogram().GetSampleSum() != 100 {
		t.Errorf("output token usage sum %v, want 100", u.GetHistogram().GetSampleSum())
	}
}

// A gateway with a region counts where its requests were served; one without counts no region series.
func TestRegionRequestsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Region = "us-east"
	local := director.Settlement{Routed: true, Tenant: "acme", Tier: "pro", Model: "llama", Pool: "east", HardwareClass: "l40s",
		Operation: openai.EndpointChat, Provider: "vllm", Outcome: director.OutcomeOK, Region: "us-east"}
	remote := local
	remote.Pool, remote.Region = "west", "us-west"
	managed := local
	managed.Pool, managed.Region, managed.HardwareClass = "fallback/together", "", director.ManagedClass
	refused := director.Settlement{Tenant: "acme", Tier: "pro", Model: "llama", Outcome: director.OutcomeUnavailable}
	failedOver := remote // from us-west's Envoy, whose ext_proc failed over to this gateway, served in us-west
	failedOver.From = "us-west"
	for _, st := range []director.Settlement{local, local, remote, managed, refused, failedOver} {
		m.Settled(st)
	}
	fams := parse(t, exposition(t, reg))
	to := func(r string) map[string]string {
		return map[string]string{"model": "llama", "from": "us-east", "to": r}
	}
	checkSamples(t, fams, []sample{
		{"infergate_region_requests_total", to("us-east"), 2},
		{"infergate_region_requests_total", to("us-west"), 1},
		{"infergate_region_requests_total", to("outside"), 1},
		{"infergate_region_requests_total", map[string]string{"model": "llama", "from": "us-west", "to": "us-west"}, 1},
	})
	plain := prometheus.NewRegistry()
	NewMetrics(plain).Settled(remote)
	if f := parse(t, exposition(t, plain))["infergate_region_requests_total"]; f != nil && len(f.GetMetric()) > 0 {
		t.Errorf("a gateway without a region exported %v", f.GetMetric())
	}
}

// Split requests are counted by what became of them, and the TTFT of those served split is timed by their pools.
func TestSplitRequestsAreCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	split := director.Settlement{Routed: true, Tenant: "acme", Tier: "pro", Model: "llama", Pool: "decode-l40s", HardwareClass: "l40s",
		Operation: openai.EndpointChat, Provider: "vllm", Prefill: "10.0.0.1:8000", PrefillPool: "prefill-h200", Outcome: director.OutcomeOK,
		Timing: director.Timing{TTFT: 900 * time.Millisecond}}
	fellBack := split
	fellBack.PrefillFailed, fellBack.Endpoint = true, "10.0.1.1:8001"
	failed := split
	failed.Outcome = director.OutcomeUpstream5xx
	whole := split
	whole.Prefill, whole.PrefillPool = "", ""
	for _, st := range []director.Settlement{split, split, fellBack, failed, whole} {
		m.Settled(st)
	}
	fams := parse(t, exposition(t, reg))
	pools := func(result string) map[string]string {
		return map[string]string{"model": "llama", "prefill_pool": "prefill-h200", "decode_pool": "decode-l40s", "result": result}
	}
	checkSamples(t, fams, []sample{
		{"infergate_disaggregated_requests_total", pools("split"), 2},
		{"infergate_disaggregated_requests_total", pools("prefill_failed"), 1},
		{"infergate_disaggregated_requests_total", pools("error"), 1},
	})
	if h := find(fams, "infergate_disaggregated_ttft_seconds", map[string]string{"prefill_pool": "prefill-h200"}).GetHistogram(); h.GetSampleCount() != 2 {
		t.Errorf("split TTFT observed %d times, want 2 (the served splits)", h.GetSampleCount())
	}
}

type engines map[string]fleet.EngineMetrics

func (e engines) Metrics(addr string) (fleet.EngineMetrics, bool) { m, ok := e[addr]; return m, ok }

func TestFleetCollector(t *testing.T) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inflight := &fleet.InFlight{}
	inflight.Start("127.0.0.1:18101")
	reg := prometheus.NewRegistry()
	reg.MustRegister(&FleetCollector{Policies: policies.NewStaticStore(snap), InFlight: inflight,
		Engines: engines{"127.0.0.1:18101": {Waiting: 3, Running: 12, KVUtil: 0.91, BlockSize: 16, NumBlocks: 2048}}})
	fams := parse(t, exposition(t, reg))
	checkSamples(t, fams, []sample{
		{"infergate_slo_ttft_target_seconds", map[string]string{"tier": "enterprise", "gen_ai_request_model": "llama-3.3-70b"}, 0.5},
		{"infergate_slo_ttft_target_seconds", map[string]string{"tier": "enterprise", "gen_ai_request_model": "qwen2.5-7b"}, 0.2},
		{"infergate_slo_tpot_target_seconds", map[string]string{"tier": "free", "gen_ai_request_model": "qwen2.5-7b"}, 0.1},
		{"infergate_slo_objective_ratio", map[string]string{"tier": "free"}, 0.95},
		{"infergate_pool_hourly_cost_usd", map[string]string{"pool": "llama70b-h200"}, 7},
		{"infergate_endpoint_waiting_requests", map[string]string{"endpoint": "127.0.0.1:18101"}, 3},
		{"infergate_endpoint_running_requests", map[string]string{"endpoint": "127.0.0.1:18101"}, 12},
		{"infergate_endpoint_kv_cache_usage_ratio", map[string]string{"endpoint": "127.0.0.1:18101", "pool": "llama70b-h200"}, 0.91},
		{"infergate_endpoint_inflight_requests", map[string]string{"endpoint": "127.0.0.1:18101"}, 1},
		{"infergate_endpoint_kv_cache_capacity_tokens", map[string]string{"endpoint": "127.0.0.1:18101"}, 32768},
	})
	if find(fams, "infergate_endpoint_waiting_requests", map[string]string{"endpoint": "127.0.0.1:18102"}) != nil {
		t.Error("an endpoint without a fresh reading has engine gauges")
	}
}

// promtool, Prometheus' own linter, finds nothing to say about the series.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: run `make test-deps` (Debian's prometheus package)")
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.Settled(director.Settlement{Routed: true, Tenant: "a", Tier: "t", Model: "m", ServedModel: "m", Pool: "p",
		HardwareClass: "h", Outcome: director.OutcomeOK, Good: true, Timing: director.Timing{TTFT: time.Millisecond, TPOT: time.Millisecond, MaxITL: time.Millisecond}})
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(&FleetCollector{Policies: policies.NewStaticStore(snap), InFlight: &fleet.InFlight{}})
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition(t, reg))
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
