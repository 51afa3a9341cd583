package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/deploy/observability"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// telemetryStack is the quickstart with Redis quotas and the audit log on, as a platform team runs it.
func telemetryStack(t *testing.T, envoyFile string) (*Stack, string) {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	auditDir := t.TempDir()
	keyFile := filepath.Join(t.TempDir(), "audit-key")
	if err := os.WriteFile(keyFile, []byte(auditKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: root, EnvoyFile: envoyFile, PolicyFile: "examples/quickstart/policy.yaml",
		FleetFile: "examples/quickstart/fleet.yaml", FreePorts: true, RedisAddrs: []string{redis.Addr}, AuditLog: auditDir,
		AuditKeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	// Before the audit folder goes (cleanups run last first): the gateway has flushed and closed its files.
	t.Cleanup(func() { cancel(); <-st.Closed })
	return st, auditDir
}

// scrape reads the gateway's /metrics with prometheus/common's parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

func sumCounter(fams map[string]*dto.MetricFamily, name string, match func(map[string]string) bool) float64 {
	var total float64
	for _, m := range fams[name].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if match(labels) {
			total += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// A streamed and a whole chat through the real data plane, from the openai-go client: the gateway's own
// metrics time them per tier, and the audit log holds one line each whose digests match what was sent and
// generated — and no text.
func TestGoodputTelemetryEndToEnd(t *testing.T) {
	for _, name := range []string{"full-duplex", "buffered"} {
		t.Run(name, func(t *testing.T) {
			st, auditDir := telemetryStack(t, envoyConfigs[name])
			c := client(st, "sk-demo-acme")
			ctx := context.Background()
			const secret = "the launch codes are 0000"
			params := chatParams(qwen, "You are terse.", secret)
			stream := c.Chat.Completions.NewStreaming(ctx, params)
			var streamed strings.Builder
			for stream.Next() {
				for _, ch := range stream.Current().Choices {
					streamed.WriteString(ch.Delta.Content)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			whole, err := c.Chat.Completions.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			// A request settles once its last answer has gone back to Envoy, which may be after the client has
			// read the whole response: wait for both settlements, then read what they recorded.
			acmeOK := func(l map[string]string) bool { return l["tenant"] == "acme" && l["outcome"] == "ok" }
			wait.For(t, "both requests settled", func() bool {
				return sumCounter(scrape(t, st.MetricsURL), "infergate_tenant_requests_total", acmeOK) >= 2
			})
			fams := scrape(t, st.MetricsURL)
			enterprise := func(l map[string]string) bool { return l["tier"] == "enterprise" }
			if n := sumCounter(fams, "gen_ai_server_time_to_first_token_seconds", enterprise); n != 2 {
				t.Errorf("TTFT observations for enterprise: %v, want 2", n)
			}
			if n := sumCounter(fams, "gen_ai_server_time_per_output_token_seconds", enterprise); n < 1 {
				t.Errorf("no TPOT observed for the stream")
			}
			if n := sumCounter(fams, "infergate_tenant_requests_total", acmeOK); n != 2 {
				t.Errorf("acme ok requests %v, want 2", n)
			}
			if n := sumCounter(fams, "infergate_pool_tokens_total", func(l map[string]string) bool { return l["kind"] == "prompt" }); n <= 0 {
				t.Errorf("no prompt tokens per pool")
			}
			records := auditLines(t, filepath.Join(auditDir, "acme", "current.jsonl"), 2)
			prompt, _ := json.Marshal(params.Messages)
			wantPrompt := compactDigest(t, prompt)
			for i, out := range []string{streamed.String(), whole.Choices[0].Message.Content} {
				r := records[i]
				if want := keyed([]byte(out)); r.PromptDigest != wantPrompt || r.OutputDigest != want || r.DigestKey == "" {
					t.Errorf("record %d digests %s / %s under %q, want %s / %s", i, r.PromptDigest, r.OutputDigest, r.DigestKey, wantPrompt, want)
				}
				if r.Tenant != "acme" || r.Model != qwen || r.Outcome != "ok" || r.CompletionTokens == 0 || r.E2EMillis <= 0 {
					t.Errorf("record %d: %+v", i, r)
				}
			}
			raw, _ := os.ReadFile(filepath.Join(auditDir, "acme", "current.jsonl"))
			if bytes.Contains(raw, []byte("launch codes")) || bytes.Contains(raw, []byte("sk-demo")) {
				t.Error("the audit log holds prompt text or a key")
			}
		})
	}
}

// auditKey is the audit digest key the stack is given.
const auditKey = "an e2e audit key, thirty-two bytes or more"

// keyed is the HMAC-SHA256 of b under auditKey, as an auditor computes it.
func keyed(b []byte) string {
	mac := hmac.New(sha256.New, []byte(auditKey))
	mac.Write(b)
	return hex.EncodeToString(mac.Sum(nil))
}

// compactDigest is the keyed digest of JSON without insignificant whitespace: the prompt field as the client
// sent it.
func compactDigest(t *testing.T, js []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, js); err != nil {
		t.Fatal(err)
	}
	return keyed(b.Bytes())
}

// auditLines waits until the file holds n lines (the writer is asynchronous) and decodes them.
func auditLines(t *testing.T, path string, n int) []audit.Record {
	t.Helper()
	var recs []audit.Record
	wait.For(t, "the audit lines", func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		recs = recs[:0]
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r audit.Record
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				recs = append(recs, r)
			}
		}
		return len(recs) >= n
	})
	return recs
}

// Every series the shipped dashboard and alert rules read is one a running gateway exports — with quotas,
// the audit log and engine scraping on, after traffic.
func TestObservabilityNamesOnlyExportedSeries(t *testing.T) {
	st, _ := telemetryStack(t, envoyConfigs["full-duplex"])
	c := client(st, "sk-demo-acme")
	s := c.Chat.Completions.NewStreaming(context.Background(), chatParams(llama, "You are terse.", "hello"))
	for s.Next() {
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	dash, err := observability.DashboardSeries()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := observability.RuleSeries()
	if err != nil {
		t.Fatal(err)
	}
	if len(dash) < 10 || len(rules) < 5 {
		t.Fatalf("suspiciously few series: dashboard %d, rules %d", len(dash), len(rules))
	}
	// The request's series appear as its settlement's observers run, which may be after the client has read the
	// whole stream, and the engine gauges with a scrape: wait for every one, then name those still missing.
	missing := func() []string {
		live := liveSeries(t, st.MetricsURL)
		var out []string
		for _, list := range [][]string{dash, rules} {
			for _, name := range list {
				// A rollout's series exist only with a rollout, the admission queue's once a request has
				// waited, the split requests' once one was split: TestRolloutSeriesAnswerTheDashboard,
				// TestAdmissionSeriesAreExported and TestDisaggregationSeriesAreExported check them.
				if !live[name] && !rolloutSeries(name) && !admissionSeries(name) && !disaggregationSeries(name) && !regionSeries(name) {
					out = append(out, name)
				}
			}
		}
		return out
	}
	if !wait.Until(10*time.Second, func() bool { return len(missing()) == 0 }) {
		for _, name := range missing() {
			t.Errorf("%s is queried but infergate does not export it", name)
		}
	}
}

// With quotas in Redis, a successful response read by the openai-go client carries the tenant's remaining
// request and token budget, as OpenAI's responses do.
func TestSuccessfulResponsesCarryRateLimitHeaders(t *testing.T) {
	st, _ := telemetryStack(t, envoyConfigs["full-duplex"])
	c := client(st, "sk-demo-acme")
	remaining := func() int {
		t.Helper()
		var resp *http.Response
		if _, err := c.Chat.Completions.New(context.Background(), chatParams(qwen, "s", "u"), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		for _, h := range []string{"x-ratelimit-limit-requests", "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
			"x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("no %s on a successful response", h)
			}
		}
		n, err := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-requests"))
		if err != nil {
			t.Fatalf("x-ratelimit-remaining-requests %q", resp.Header.Get("x-ratelimit-remaining-requests"))
		}
		return n
	}
	first := remaining()
	if first < 0 || first >= 50 { // acme: 50 requests per second
		t.Errorf("remaining requests %d of 50", first)
	}
}

// A request that can never fit its tenant's token limit is answered so that the official SDK does not retry
// it (x-should-retry: false): with retries on, the gateway sees it once.
func TestNeverFittingRequestIsNotRetriedBySDK(t *testing.T) {
	st, _ := telemetryStack(t, envoyConfigs["full-duplex"])
	c := openai.NewClient(option.WithBaseURL(st.URL+"/v1"), option.WithAPIKey("sk-demo-initech"), option.WithMaxRetries(2),
		option.WithRequestTimeout(30*time.Second))
	params := chatParams(qwen, "s", "u")
	params.MaxTokens = openai.Int(100000) // initech may use 20,000 tokens a minute
	var resp *http.Response
	_, err := c.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("got %v, want a 429", err)
	}
	if resp == nil || resp.Header.Get("x-should-retry") != "false" || resp.Header.Get("retry-after") != "" {
		t.Errorf("headers %v: want x-should-retry false and no retry-after", resp.Header)
	}
	fams := scrape(t, st.MetricsURL)
	if n := sumCounter(fams, "infergate_requests_total", func(l map[string]string) bool { return l["outcome"] == "rate_limit_exceeded" }); n != 1 {
		t.Errorf("the gateway saw the request %v times, want once (the SDK must not retry)", n)
	}
}

// GET /v1/models/{id} answers the model object for any name the tenant may call, and 404 otherwise.
func TestModelsGetThroughGateway(t *testing.T) {
	st := startStack(t, envoyConfigs["full-duplex"])
	acme, initech := client(st, "sk-demo-acme"), client(st, "sk-demo-initech")
	m, err := acme.Models.Get(context.Background(), "llama-70b")
	if err != nil || m.ID != "llama-70b" || m.Object != "model" {
		t.Fatalf("Models.Get(llama-70b) = %+v, %v", m, err)
	}
	_, err = initech.Models.Get(context.Background(), llama)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("initech's Models.Get(%s) = %v, want 404", llama, err)
	}
}

// liveSeries names every series the gateway at url exports now, a histogram's _bucket, _sum and _count too.
func liveSeries(t *testing.T, url string) map[string]bool {
	t.Helper()
	live := map[string]bool{}
	for name, f := range scrape(t, url) {
		live[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			live[name+"_bucket"], live[name+"_sum"], live[name+"_count"] = true, true, true
		}
	}
	return live
}

// unexported waits up to 10 s for the gateway to export every series of want (they appear as settlements'
// observers run) and returns those it still does not.
func unexported(t *testing.T, st *Stack, want []string) []string {
	t.Helper()
	var missing []string
	wait.Until(10*time.Second, func() bool {
		missing = missing[:0]
		live := liveSeries(t, st.MetricsURL)
		for _, name := range want {
			if !live[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	})
	return missing
}

// queriedSeries is every series the shipped dashboard and rules read that keep selects, once each.
func queriedSeries(t *testing.T, keep func(string) bool) []string {
	t.Helper()
	dash, err := observability.DashboardSeries()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := observability.RuleSeries()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range append(dash, rules...) {
		if keep(name) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}
