package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/infergate/infergate/deploy/observability"
	"github.com/infergate/infergate/test/wait"
)

// prometheus is Debian's Prometheus server, scraping one target every 500 ms from a folder of its own.
type prometheus struct {
	url string
}

func startPrometheus(t *testing.T, target, rules string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run `make test-deps` (Debian's prometheus package)")
	}
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fmt.Sprintf("global: {scrape_interval: 500ms, evaluation_interval: 500ms}\nrule_files: [%q]\n"+
		"scrape_configs:\n- job_name: infergate\n  metrics_path: %s\n  static_configs: [{targets: [%q]}]\n", rules, u.Path, u.Host)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cancel(); <-exited })
	p := &prometheus{url: "http://" + addr}
	wait.For(t, "prometheus to be ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", logs.String())
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// query runs an instant PromQL query and returns each series' value by the given label.
func (p *prometheus) query(t *testing.T, expr, by string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body.Status != "success" {
		t.Fatalf("query %s: %s", expr, body.Error)
	}
	out := map[string]float64{}
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err == nil {
			out[r.Metric[by]] = v
		}
	}
	return out
}

// grafanaVars fills the dashboard's variables as Grafana would with "All" selected and a short range.
var grafanaVars = strings.NewReplacer(`"$tier"`, `".*"`, `"$model"`, `".*"`, "$__rate_interval", "1m", "$__range", "5m")

// A real Prometheus, loading the shipped rules and scraping a gateway under traffic from two tiers, answers
// every query of the shipped dashboard; its goodput and TTFT p95 panels give a value per tier.
func TestPrometheusAnswersTheDashboard(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	queries, err := observability.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	st, _ := telemetryStack(t, envoyConfigs["full-duplex"])
	prom := startPrometheus(t, st.MetricsURL, filepath.Join(root, "deploy/observability/rules.yaml"))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, key := range []string{"sk-demo-acme", "sk-demo-globex"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(st, key)
			for ctx.Err() == nil {
				s := c.Chat.Completions.NewStreaming(ctx, chatParams(qwen, "You are terse.", "hello "+key))
				for s.Next() {
				}
				_ = s.Close()
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	first := func(panel string) string {
		for _, q := range queries {
			if q.Panel == panel {
				return grafanaVars.Replace(q.Expr)
			}
		}
		t.Fatalf("the dashboard has no panel %q", panel)
		return ""
	}
	goodput, ttftP95 := first("Goodput per tier"), first("TTFT p95 / p50 per tier vs target")
	var ratios, p95 map[string]float64
	wait.For(t, "prometheus to have rates for both tiers", func() bool {
		ratios, p95 = prom.query(t, goodput, "tier"), prom.query(t, ttftP95, "tier")
		return len(ratios) == 2 && len(p95) == 2
	})
	for _, tier := range []string{"enterprise", "pro"} {
		if r := ratios[tier]; r < 0 || r > 1 {
			t.Errorf("goodput ratio of %s = %v, want a share", tier, r)
		}
		if q := p95[tier]; q <= 0 || q > 40 {
			t.Errorf("TTFT p95 of %s = %v s", tier, q)
		}
	}
	t.Logf("goodput %v, TTFT p95 %v", ratios, p95)
	// Every other query is valid PromQL over series that exist (the burn rate once the rules have run).
	var empty []string
	defer func() {
		if t.Failed() {
			t.Logf("queries without an answer: %v", empty)
		}
	}()
	wait.For(t, "every dashboard query to answer", func() bool {
		empty = empty[:0]
		for _, q := range queries {
			// A rollout's panels read series that exist only with a rollout (TestRolloutSeriesAnswerTheDashboard),
			// the admission queue's only once a request has waited (TestAdmissionSeriesAreExported), the split
			// requests' once one was split (TestDisaggregationSeriesAreExported).
			if rolloutSeries(q.Expr) || admissionSeries(q.Expr) || disaggregationSeries(q.Expr) || regionSeries(q.Expr) {
				continue
			}
			if len(prom.query(t, grafanaVars.Replace(q.Expr), "")) == 0 {
				empty = append(empty, q.Where)
			}
		}
		return len(empty) == 0
	})
}
