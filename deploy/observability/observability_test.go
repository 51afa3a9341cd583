package observability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/test/manifest"
)

// exportedHistograms are the histograms infergate exports; queries read them through their _bucket, _sum and
// _count series.
var exportedHistograms = []string{
	"gen_ai_server_time_to_first_token_seconds",
	"gen_ai_server_time_per_output_token_seconds",
	"gen_ai_server_request_duration_seconds",
	"gen_ai_client_token_usage",
	"infergate_inter_token_latency_max_seconds",
	"infergate_queue_duration_seconds",
	"infergate_admission_wait_seconds",
	"infergate_disaggregated_ttft_seconds",
}

// exportedSeries is every series infergate exports that the rules and the dashboard may read.
var exportedSeries = append(histogramSeries(exportedHistograms),
	// counters
	"infergate_tenant_requests_total",
	"infergate_tenant_good_requests_total",
	"infergate_pool_tokens_total",
	"infergate_disaggregated_requests_total",
	"infergate_region_requests_total",
	"infergate_tokens_total",
	"infergate_cost_usd_total",
	"infergate_requests_total",
	"infergate_responses_total",
	"infergate_policy_reloads_total",
	"infergate_audit_dropped_total",
	// gauges
	"infergate_slo_ttft_target_seconds",
	"infergate_slo_tpot_target_seconds",
	"infergate_slo_objective_ratio",
	"infergate_pool_hourly_cost_usd",
	"infergate_endpoint_waiting_requests",
	"infergate_endpoint_running_requests",
	"infergate_endpoint_kv_cache_usage_ratio",
	"infergate_endpoint_inflight_requests",
	"infergate_endpoint_kv_cache_capacity_tokens",
	"infergate_pool_replicas",
	"infergate_pool_desired_replicas",
	"infergate_quota_backend_up",
	"infergate_quota_settlements_dropped_total",
	"infergate_policy_last_reload_success",
	"infergate_inflight_requests",
	"infergate_rollout_state",
	"infergate_rollout_step",
	"infergate_rollout_candidate_share",
	"infergate_rollout_gate_evidence",
	"infergate_rollout_step_requests",
	"infergate_rollout_eval_pass_rate",
	"infergate_admission_queue_requests",
	"infergate_admission_queue_bytes",
	"infergate_admission_results_total",
)

func histogramSeries(hs []string) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h+"_bucket", h+"_sum", h+"_count")
	}
	return out
}

// requiredAlerts are the alerts rules.yaml must define, with the severities each must come in.
var requiredAlerts = map[string][]string{
	"GoodputBelowSLO":         {"critical", "warning"},
	"TTFTP95NearSLO":          {"warning"},
	"KVCachePressure":         {"warning"},
	"QueueDepthHigh":          {"warning"},
	"PrefixCacheHitRateLow":   {"info"},
	"ErrorRateHigh":           {"warning"},
	"QuotaBackendDown":        {"critical"},
	"QuotaSettlementsDropped": {"warning"},
	"PolicyReloadFailed":      {"warning"},
	"AuditLinesDropped":       {"warning"},
	"RolloutRolledBack":       {"warning"},
	"RolloutStalled":          {"warning"},
	"RolloutShadowDiverging":  {"warning"},
	"AdmissionShedding":       {"warning"},
}

// promtool returns promtool's path; it is a test dependency, never a reason to skip.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found in PATH: run `make test-deps` (it installs Debian's prometheus package, which provides promtool)")
	}
	return p
}

// runPromtool runs promtool in dir and returns its combined output and whether it exited 0.
func runPromtool(t *testing.T, dir string, args ...string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("promtool %v: %v", args, ctx.Err())
	}
	return string(out), err == nil
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	rf, err := parseRules(rulesYAML)
	if err != nil {
		t.Fatal(err)
	}
	return rf
}

// Every file passes promtool: the rules check, the rules' unit tests, and the dashboard's expressions (as recording
// rules, with Grafana's variables filled in) parse as PromQL.
func TestPromtool(t *testing.T) {
	tests := []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"check rules.yaml", func(*testing.T) []string { return []string{"check", "rules", "rules.yaml"} }},
		{"unit tests rules_test.yaml", func(*testing.T) []string { return []string{"test", "rules", "rules_test.yaml"} }},
		{"dashboard expressions parse", func(t *testing.T) []string {
			return []string{"check", "rules", dashboardAsRules(t)}
		}},
		{"PrometheusRule groups check", func(t *testing.T) []string {
			groups := operatorDoc(t, "PrometheusRule")["spec"].(map[string]any)["groups"]
			return []string{"check", "rules", writeYAML(t, "operator-rules.yaml", map[string]any{"groups": groups})}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args(t)
			out, ok := runPromtool(t, ".", args...)
			if !ok || !strings.Contains(out, "SUCCESS") {
				t.Fatalf("promtool %s failed:\n%s", strings.Join(args, " "), out)
			}
		})
	}
}

var (
	grafanaInterval = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)
	grafanaOther    = regexp.MustCompile(`\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*`)
)

// dashboardAsRules writes every dashboard expression as a recording rule (durations for Grafana's interval
// variables, ".*" for the template variables, which only appear in regex matchers) and returns the file's path.
func dashboardAsRules(t *testing.T) string {
	t.Helper()
	exprs, err := dashboardExprs(dashboardJSON)
	if err != nil {
		t.Fatal(err)
	}
	var rules []map[string]string
	for i, e := range exprs {
		expr := grafanaInterval.ReplaceAllString(e.Expr, "5m")
		expr = grafanaOther.ReplaceAllString(expr, ".*")
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:expr_%d:check", i), "expr": expr})
	}
	return writeYAML(t, "dashboard-rules.yaml", map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
}

func writeYAML(t *testing.T, name string, v any) string {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The unit tests would notice a broken rule: each mutation of rules.yaml below (a threshold, a join, an
// aggregation, a window) must make `promtool test rules` fail.
func TestRulesTestsCatchMutations(t *testing.T) {
	tests := []struct {
		name, from, to string
	}{
		{"goodput: no fallback for models with no good request", `
        or
        0 * sum by (tier, model) (rate(infergate_tenant_requests_total{outcome!~"client_error|quota"}[1h]))`, ""},
		{"goodput: client errors counted as eligible (30m)",
			`(sum by (tier, model) (rate(infergate_tenant_requests_total{outcome!~"client_error|quota"}[30m])) > 0)`,
			`(sum by (tier, model) (rate(infergate_tenant_requests_total[30m])) > 0)`},
		{"goodput: objective not joined on tier", `(1 - max by (tier) (infergate_slo_objective_ratio))`, `(1 - 0.99)`},
		{"goodput: page without the short window", "infergate:goodput_burn_rate:rate1h > 14.4\n      and\n      infergate:goodput_burn_rate:rate5m > 14.4",
			"infergate:goodput_burn_rate:rate1h > 14.4"},
		{"goodput: page threshold", "rate5m > 14.4", "rate5m > 21"},
		{"goodput: ticket threshold", "rate6h > 6", "rate6h > 12"},
		{"ttft: threshold at 70 %", "0.8 * max by (tier, gen_ai_request_model)", "0.7 * max by (tier, gen_ai_request_model)"},
		{"ttft: join on tier only", "> on (tier, gen_ai_request_model)\n      0.8", "> on (tier) group_left\n      0.8"},
		{"ttft: pools not summed", "sum by (le, tier, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))",
			"sum by (le, tier, gen_ai_request_model, pool) (rate(gen_ai_server_time_to_first_token_seconds_bucket[5m])))"},
		{"tpot: wrong quantile", "histogram_quantile(0.95,\n        sum by (le, tier, gen_ai_request_model) (rate(gen_ai_server_time_per_output_token_seconds_bucket",
			"histogram_quantile(0.9,\n        sum by (le, tier, gen_ai_request_model) (rate(gen_ai_server_time_per_output_token_seconds_bucket"},
		{"kv: per replica and >=", "max by (model, pool, endpoint) (infergate_endpoint_kv_cache_usage_ratio) > 0.9", "infergate_endpoint_kv_cache_usage_ratio >= 0.9"},
		{"queue: idle engines included", "> 2 * (max by (model, pool, endpoint) (infergate_endpoint_running_requests) > 0)",
			">= 2 * max by (model, pool, endpoint) (infergate_endpoint_running_requests)"},
		{"prefix: per pool", `sum by (model) (rate(infergate_pool_tokens_total{kind="cached"}[30m]))`, `sum by (model, pool) (rate(infergate_pool_tokens_total{kind="cached"}[30m]))`},
		{"prefix: prompt-heavy at 2×", ">= 4 * sum by (model)", ">= 2 * sum by (model)"},
		{"errors: quota counted", "saturated|unavailable|upstream_5xx|reset|timeout", "saturated|unavailable|upstream_5xx|reset|timeout|quota"},
		{"errors: threshold", "> 0.005", "> 0.003"},
		{"quota: no for", "infergate_quota_backend_up == 0\n    for: 1m", "infergate_quota_backend_up == 0\n    for: 0m"},
		{"policy: counter ignored", "      or\n      sum without (result)", "      and\n      sum without (result)"},
		{"audit: threshold", "increase(infergate_audit_dropped_total[10m]) > 0", "increase(infergate_audit_dropped_total[10m]) > 5"},
		{"settlements: threshold", "increase(infergate_quota_settlements_dropped_total[10m]) > 10", "increase(infergate_quota_settlements_dropped_total[10m]) > 40"},
		{"settlements: window", "increase(infergate_quota_settlements_dropped_total[10m])", "increase(infergate_quota_settlements_dropped_total[30m])"},
	}
	unitTests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(rulesYAML, []byte(tc.from)) {
				t.Fatalf("rules.yaml no longer contains %q: update this mutation", tc.from)
			}
			dir := t.TempDir()
			mutated := bytes.Replace(rulesYAML, []byte(tc.from), []byte(tc.to), 1)
			for name, data := range map[string][]byte{"rules.yaml": mutated, "rules_test.yaml": unitTests} {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if out, ok := runPromtool(t, dir, "test", "rules", "rules_test.yaml"); ok {
				t.Fatalf("promtool test rules still passes with the mutation:\n%s", out)
			}
		})
	}
}

// rules.yaml defines every required alert, each with a severity and human-readable annotations, names its
// recording rules level:metric:operations, and reads only series infergate exports.
// runbookBase is where every alert's runbook_url points: a section of docs/operations.md named after it.
const runbookBase = "https://github.com/infergate/infergate/blob/main/docs/operations.md#"

func TestRules(t *testing.T) {
	rf := loadRules(t)
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	runbooks := map[string]bool{}
	for _, line := range strings.Split(string(ops), "\n") {
		if name, ok := strings.CutPrefix(line, "### "); ok {
			runbooks[strings.ToLower(name)] = true
		}
	}
	severities := map[string][]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if (r.Record == "") == (r.Alert == "") {
				t.Errorf("group %s: a rule needs exactly one of record and alert: %+v", g.Name, r)
				continue
			}
			if r.Record != "" {
				if strings.Count(r.Record, ":") != 2 || !strings.HasPrefix(r.Record, "infergate:") {
					t.Errorf("recording rule %s: want infergate:<metric>:<operations>", r.Record)
				}
				if len(r.Labels)+len(r.Annotations) > 0 || r.For != "" {
					t.Errorf("recording rule %s: labels, annotations and for belong to alerts", r.Record)
				}
				continue
			}
			sev := r.Labels["severity"]
			if !slices.Contains([]string{"critical", "warning", "info"}, sev) {
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, sev)
			}
			severities[r.Alert] = append(severities[r.Alert], sev)
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s (%s): no %s annotation", r.Alert, sev, a)
				}
			}
			if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("alert %s (%s): runbook_url %q, want %q", r.Alert, sev, r.Annotations["runbook_url"], want)
			}
			if !runbooks[strings.ToLower(r.Alert)] {
				t.Errorf("alert %s: docs/operations.md has no section %q", r.Alert, "### "+r.Alert)
			}
			if strings.Contains(r.Expr, "keep_firing_for") {
				t.Errorf("alert %s: keep_firing_for needs Prometheus 2.44, Debian's promtool is 2.42", r.Alert)
			}
		}
	}
	for name, want := range requiredAlerts {
		got := slices.Clone(severities[name])
		slices.Sort(got)
		w := slices.Clone(want)
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("alert %s: severities %v, want %v", name, got, w)
		}
	}
	for name := range severities {
		if _, ok := requiredAlerts[name]; !ok {
			t.Errorf("alert %s is not in requiredAlerts: add it (and its unit tests)", name)
		}
	}

	series, err := RuleSeries()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range series {
		if !slices.Contains(exportedSeries, s) {
			t.Errorf("rules.yaml reads %s, which infergate does not export", s)
		}
	}
}

// unitTestFile is the part of a promtool test file this package checks.
type unitTestFile struct {
	RuleFiles      []string `yaml:"rule_files"`
	GroupEvalOrder []string `yaml:"group_eval_order"`
	Tests          []struct {
		Name           string `yaml:"name"`
		PromQLExprTest []struct {
			Expr string `yaml:"expr"`
		} `yaml:"promql_expr_test"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// rules_test.yaml exercises everything: each alert fires in some evaluation (in each of its severities) and stays
// quiet in another, each recording rule's value is checked (directly or through a rule that reads it), and the groups are evaluated in a fixed order (promtool
// otherwise orders them at random, and alerts would read the previous minute's recorded values now and then).
func TestRulesTestCoverage(t *testing.T) {
	data, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ut unitTestFile
	if err := yaml.Unmarshal(data, &ut); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ut.RuleFiles, []string{"rules.yaml"}) {
		t.Errorf("rule_files %v, want [rules.yaml]", ut.RuleFiles)
	}
	rf := loadRules(t)
	var groups []string
	for _, g := range rf.Groups {
		groups = append(groups, g.Name)
	}
	if !slices.Equal(ut.GroupEvalOrder, groups) {
		t.Errorf("group_eval_order %v, want rules.yaml's groups in order %v", ut.GroupEvalOrder, groups)
	}

	fired := map[string]map[string]bool{}
	quiet := map[string]bool{}
	pinned := map[string]bool{}
	for _, tg := range ut.Tests {
		for _, at := range tg.AlertRuleTest {
			if len(at.ExpAlerts) == 0 {
				quiet[at.Alertname] = true
			}
			for _, a := range at.ExpAlerts {
				if fired[at.Alertname] == nil {
					fired[at.Alertname] = map[string]bool{}
				}
				fired[at.Alertname][a.ExpLabels["severity"]] = true
			}
		}
		for _, pt := range tg.PromQLExprTest {
			names, err := metricNames(pt.Expr)
			if err != nil {
				t.Errorf("test %s: %v", tg.Name, err)
			}
			for _, n := range names {
				pinned[n] = true
			}
		}
	}
	for name, sevs := range requiredAlerts {
		for _, s := range sevs {
			if !fired[name][s] {
				t.Errorf("no unit test makes %s (severity %s) fire", name, s)
			}
		}
		if !quiet[name] {
			t.Errorf("no unit test expects %s to stay quiet", name)
		}
	}
	// A recording rule read by a checked one is checked through it (a burn rate pins its goodput ratio).
	rec := recordingRules(rf)
	for changed := true; changed; {
		changed = false
		for name, expr := range rec {
			if !pinned[name] {
				continue
			}
			inner, err := metricNames(expr)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range inner {
				if _, ok := rec[n]; ok && !pinned[n] {
					pinned[n], changed = true, true
				}
			}
		}
	}
	for rec := range rec {
		if !pinned[rec] {
			t.Errorf("no promql_expr_test checks recording rule %s", rec)
		}
	}
}

// operatorDoc returns the document of prometheus-operator.yaml of the given kind.
func operatorDoc(t *testing.T, kind string) map[string]any {
	t.Helper()
	var found map[string]any
	for _, d := range manifest.DecodeAll(t, "prometheus-operator.yaml") {
		if d["apiVersion"] != "monitoring.coreos.com/v1" {
			t.Errorf("%v: apiVersion %v, want monitoring.coreos.com/v1", d["kind"], d["apiVersion"])
		}
		if d["kind"] == kind {
			if found != nil {
				t.Fatalf("two %s documents", kind)
			}
			found = d
		}
	}
	if found == nil {
		t.Fatalf("prometheus-operator.yaml has no %s", kind)
	}
	return found
}

// The PrometheusRule carries exactly rules.yaml's groups.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	var want map[string]any
	if err := yaml.Unmarshal(rulesYAML, &want); err != nil {
		t.Fatal(err)
	}
	pr := operatorDoc(t, "PrometheusRule")
	if ns := manifest.Get(pr, "metadata", "namespace"); ns != "infergate" {
		t.Errorf("PrometheusRule namespace %v, want infergate", ns)
	}
	spec, _ := pr["spec"].(map[string]any)
	if len(spec) != 1 || spec["groups"] == nil {
		t.Fatalf("PrometheusRule spec must hold groups only, has %v", keys(spec))
	}
	got, _ := spec["groups"].([]any)
	wantGroups, _ := want["groups"].([]any)
	if len(got) != len(wantGroups) {
		t.Fatalf("PrometheusRule has %d groups, rules.yaml %d", len(got), len(wantGroups))
	}
	for i := range wantGroups {
		if !reflect.DeepEqual(got[i], wantGroups[i]) {
			g, _ := json.MarshalIndent(got[i], "", "  ")
			w, _ := json.MarshalIndent(wantGroups[i], "", "  ")
			t.Errorf("group %d differs from rules.yaml (regenerate, see deploy/observability/README.md)\ngot:  %s\nwant: %s", i, g, w)
		}
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The ServiceMonitor scrapes /metrics on the Service port deploy/kubernetes/infergate.yaml routes to the pods'
// metrics container port, in the infergate namespace.
func TestServiceMonitor(t *testing.T) {
	sm := operatorDoc(t, "ServiceMonitor")
	if ns := manifest.Get(sm, "metadata", "namespace"); ns != "infergate" {
		t.Errorf("ServiceMonitor namespace %v, want infergate", ns)
	}
	if names, _ := manifest.Get(sm, "spec", "namespaceSelector", "matchNames").([]any); !reflect.DeepEqual(names, []any{"infergate"}) {
		t.Errorf("namespaceSelector.matchNames %v, want [infergate]", names)
	}
	selector, _ := manifest.Get(sm, "spec", "selector", "matchLabels").(map[string]any)
	if !reflect.DeepEqual(selector, map[string]any{"app.kubernetes.io/name": "infergate"}) {
		t.Errorf("selector.matchLabels %v, want app.kubernetes.io/name: infergate", selector)
	}
	endpoints, _ := manifest.Get(sm, "spec", "endpoints").([]any)
	if len(endpoints) != 1 {
		t.Fatalf("want one endpoint, got %v", endpoints)
	}
	ep, _ := endpoints[0].(map[string]any)
	if ep["path"] != "/metrics" {
		t.Errorf("endpoint path %v, want /metrics", ep["path"])
	}

	var svc, deploy map[string]any
	for _, d := range manifest.DecodeAll(t, "../kubernetes/infergate.yaml") {
		if manifest.Get(d, "metadata", "name") != "infergate" || manifest.Get(d, "metadata", "namespace") != "infergate" {
			continue
		}
		switch d["kind"] {
		case "Service":
			svc = d
		case "Deployment":
			deploy = d
		}
	}
	if svc == nil || deploy == nil {
		t.Fatal("deploy/kubernetes/infergate.yaml: no infergate Service or Deployment in namespace infergate")
	}
	var target any
	ports, _ := manifest.Get(svc, "spec", "ports").([]any)
	for _, p := range ports {
		if pm, _ := p.(map[string]any); pm["name"] == ep["port"] {
			target = pm["targetPort"]
		}
	}
	if target != "metrics" {
		t.Errorf("the Service's port %v must exist and target the container port named metrics (targets %v)", ep["port"], target)
	}
	containers, _ := manifest.Get(deploy, "spec", "template", "spec", "containers").([]any)
	metricsPort := false
	for _, c := range containers {
		cps, _ := manifest.Get(c, "ports").([]any)
		for _, p := range cps {
			if pm, _ := p.(map[string]any); pm["name"] == "metrics" && pm["containerPort"] == 9090 {
				metricsPort = true
			}
		}
	}
	if !metricsPort {
		t.Error("the Deployment has no container port metrics: 9090")
	}
	// The Service in deploy/kubernetes has no labels yet, so this ServiceMonitor selects it only once it is given
	// app.kubernetes.io/name: infergate; from then on its labels must match the selector.
	if labels, _ := manifest.Get(svc, "metadata", "labels").(map[string]any); len(labels) > 0 {
		for k, v := range selector {
			if labels[k] != v {
				t.Errorf("the Service's labels %v do not match the ServiceMonitor's selector %v", labels, selector)
			}
		}
	}
}

// The dashboard is a schema-39 Grafana dashboard on a ${datasource} Prometheus variable with tier and model
// variables, every query on that datasource, and every expression reading only exported series and rules.yaml's
// recording rules.
func TestDashboard(t *testing.T) {
	var d map[string]any
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		t.Fatal(err)
	}
	if d["schemaVersion"] != float64(39) {
		t.Errorf("schemaVersion %v, want 39", d["schemaVersion"])
	}
	if d["uid"] == "" || d["title"] == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	ds := map[string]any{"type": "prometheus", "uid": "${datasource}"}

	vars := map[string]map[string]any{}
	list, _ := manifest.Get(d, "templating", "list").([]any)
	for _, v := range list {
		vm, _ := v.(map[string]any)
		name, _ := vm["name"].(string)
		vars[name] = vm
	}
	if v := vars["datasource"]; v == nil || v["type"] != "datasource" || v["query"] != "prometheus" {
		t.Errorf("want a datasource variable of type prometheus, got %v", v)
	}
	for _, name := range []string{"tier", "model"} {
		v := vars[name]
		if v == nil || v["type"] != "query" || !reflect.DeepEqual(v["datasource"], ds) || v["multi"] != true || v["includeAll"] != true {
			t.Errorf("variable %s: want a multi-value query variable on ${datasource} with All, got %v", name, v)
		}
	}

	ids := map[float64]string{}
	titles := map[string]bool{}
	var walk func([]any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			title, _ := pm["title"].(string)
			id, _ := pm["id"].(float64)
			if prev, dup := ids[id]; dup {
				t.Errorf("panels %q and %q share id %v", prev, title, id)
			}
			ids[id] = title
			titles[title] = true
			if pm["type"] != "row" {
				if !reflect.DeepEqual(pm["datasource"], ds) {
					t.Errorf("panel %q: datasource %v, want %v", title, pm["datasource"], ds)
				}
				targets, _ := pm["targets"].([]any)
				if len(targets) == 0 {
					t.Errorf("panel %q has no query", title)
				}
				for _, tg := range targets {
					if td := manifest.Get(tg, "datasource"); !reflect.DeepEqual(td, ds) {
						t.Errorf("panel %q: a target's datasource is %v, want %v", title, td, ds)
					}
				}
			}
			if x, w := manifest.Get(pm, "gridPos", "x"), manifest.Get(pm, "gridPos", "w"); x == nil || w == nil || x.(float64)+w.(float64) > 24 {
				t.Errorf("panel %q: gridPos %v is off the 24-column grid", title, pm["gridPos"])
			}
			sub, _ := pm["panels"].([]any)
			walk(sub)
		}
	}
	panels, _ := d["panels"].([]any)
	walk(panels)
	for _, want := range []string{"Goodput per tier", "TTFT p95 / p50 per tier vs target", "TPOT p95 per tier vs target",
		"Requests by outcome", "Prefix-cache hit ratio per pool", "Cost per 1M output tokens per pool",
		"Waiting and running requests per endpoint", "KV cache usage per endpoint", "In-flight requests",
		"Tokens by tenant", "Spend by tenant"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}

	rec := recordingRules(loadRules(t))
	exprs, err := dashboardExprs(dashboardJSON)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		t.Run(e.Where, func(t *testing.T) {
			names, err := metricNames(e.Expr)
			if err != nil {
				t.Fatal(err)
			}
			if len(names) == 0 {
				t.Errorf("%q reads no series", e.Expr)
			}
			for _, n := range names {
				used[n] = true
				if _, isRule := rec[n]; !isRule && !slices.Contains(exportedSeries, n) {
					t.Errorf("%q reads %s, neither exported by infergate nor recorded by rules.yaml", e.Expr, n)
				}
			}
		})
	}

	// DashboardSeries resolves the recording rules to exported series.
	series, err := DashboardSeries()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(series) || len(slices.Compact(slices.Clone(series))) != len(series) {
		t.Errorf("DashboardSeries is not sorted and deduplicated: %v", series)
	}
	for _, s := range series {
		if !slices.Contains(exportedSeries, s) {
			t.Errorf("DashboardSeries returns %s, which infergate does not export", s)
		}
	}
	for n := range used {
		if _, isRule := rec[n]; !isRule && !slices.Contains(series, n) {
			t.Errorf("DashboardSeries misses %s", n)
		}
	}
}

// Every metric family infergate exports is shown on the dashboard or watched by a rule.
func TestEverySeriesUsed(t *testing.T) {
	dash, err := DashboardSeries()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := RuleSeries()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, s := range append(dash, rules...) {
		used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s, "_bucket"), "_sum"), "_count")] = true
	}
	for _, s := range exportedSeries {
		family := s
		for _, h := range exportedHistograms {
			if strings.HasPrefix(s, h+"_") {
				family = h
			}
		}
		if !used[family] {
			t.Errorf("%s is exported but neither the dashboard nor the rules read it", family)
		}
	}
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		name, expr string
		want       []string
		wantErr    string
	}{
		{"bare vector", "up", []string{"up"}, ""},
		{"matchers and range", `sum by (tier, model) (rate(a_total{outcome!~"client_error|quota"}[5m]))`, []string{"a_total"}, ""},
		{"grafana variables", `histogram_quantile(0.95, sum by (le) (rate(x_bucket{tier=~"$tier",m=~"${model:regex}"}[$__rate_interval])))`, []string{"x_bucket"}, ""},
		{"group_left with empty list", "a / on (tier) group_left () (1 - max by (tier) (b))", []string{"a", "b"}, ""},
		{"group_left without list", "a / ignoring (outcome) group_left sum(rate(b[5m])) > 0.005", []string{"a", "b"}, ""},
		{"trailing by", "sum(rate(x[5m])) by (le, pool)", []string{"x"}, ""},
		{"numbers and offset", "x * 1e6 + y offset 5m - 0x1f + .5", []string{"x", "y"}, ""},
		{"strings are not names", `label_replace(up, "dst", "$1", "src", "(.*)")`, []string{"up"}, ""},
		{"keywords in any case", "a > bool 0.9 AND b Or c unless d", []string{"a", "b", "c", "d"}, ""},
		{"subquery and @", "max_over_time(rate(x[5m])[1h:1m]) @ start()", []string{"x"}, ""},
		{"recording rule names", "infergate:goodput_ratio:rate5m < 0.9", []string{"infergate:goodput_ratio:rate5m"}, ""},
		{"braces inside strings", `x{a="}{", b='\'}'}`, []string{"x"}, ""},
		{"without", "sum without (instance, job) (x) / y", []string{"x", "y"}, ""},
		{"duplicates once", "a / a", []string{"a"}, ""},
		{"label names after by are not names", "sum by (tier) (x) > on (tier) y", []string{"x", "y"}, ""},
		{"aggregation keywords in any case", "SUM BY (a) (x) / Count Without (b) (y)", []string{"x", "y"}, ""},
		{"count_values label is a string", `count_values("le", x)`, []string{"x"}, ""},
		{"clause on a non-aggregation", "rate by (a) (x)", nil, "not an aggregation"},
		{"__name__ refused", `{__name__="x"}`, nil, "__name__"},
		{"unknown function", "rat(x[5m])", nil, "unknown function"},
		{"unbalanced", "x{a=\"b\"", nil, "unbalanced"},
		{"unterminated string", `x{a="b}`, nil, "unterminated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := metricNames(tc.expr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("metricNames(%q) = %v, %v; want an error containing %q", tc.expr, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("metricNames(%q) = %v, %v; want %v", tc.expr, got, err, tc.want)
			}
		})
	}
}

func TestDashboardExprs(t *testing.T) {
	tests := []struct {
		name, json string
		want       []string
		wantErr    bool
	}{
		{"targets, collapsed rows and variables", `{
			"panels": [
				{"id": 1, "title": "a", "targets": [{"refId": "A", "expr": "x"}, {"refId": "B", "expr": "y"}]},
				{"id": 2, "type": "row", "title": "r", "panels": [{"id": 3, "title": "b", "targets": [{"refId": "A", "expr": "z"}]}]}
			],
			"templating": {"list": [
				{"name": "datasource", "type": "datasource", "query": "prometheus"},
				{"name": "tier", "type": "query", "query": {"query": "label_values(v1, tier)"}},
				{"name": "model", "type": "query", "query": "label_values(v2{tier=~\"$tier\"}, model)"}
			]}}`, []string{"x", "y", "z", "v1", `v2{tier=~"$tier"}`}, false},
		{"a variable query that is not label_values", `{"templating": {"list": [{"name": "t", "type": "query", "query": "query_result(x)"}]}}`, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := dashboardExprs([]byte(tc.json))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("want an error, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var exprs []string
			for _, e := range got {
				exprs = append(exprs, e.Expr)
			}
			if !slices.Equal(exprs, tc.want) {
				t.Fatalf("got %q, want %q", exprs, tc.want)
			}
		})
	}
}
