package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/envoysim"
	"github.com/infergate/infergate/test/loadgen"
	"github.com/infergate/infergate/test/wait"
)

// busyEngine is a stand-in vLLM replica whose /metrics reports the queue the test sets, and which answers every
// chat request it receives at once.
type busyEngine struct {
	*httptest.Server
	waiting  atomic.Int64
	received atomic.Int64
}

func newBusyEngine(t *testing.T) *busyEngine {
	e := &busyEngine{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} %d\n"+
				"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 8\n", e.waiting.Load())
		case "/health":
		default:
			e.received.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("content-type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
		}
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *busyEngine) addr() string { return strings.TrimPrefix(e.URL, "http://") }

// admissionStack is the data plane configured by envoyFile (a copy of a shipped one, edited by edit) in front
// of an in-process gateway whose policy queues requests for model m on one busy engine.
func admissionStack(t *testing.T, e *busyEngine, edit func(string) string, quota string, redis []string) *Stack {
	t.Helper()
	envoy, err := os.ReadFile(repoPath(t, "deploy/envoy/envoy-xds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {maxWaiting: 1}
  admission: {maxQueueWait: 4s}
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: m
    pools:
    - {name: p, hardwareClass: h200, engine: vllm, endpoints: [%q]}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]%s}
`, e.addr(), quota)
	dir := stackFiles(t, map[string]string{"envoy.yaml": edit(string(envoy)), "policy.yaml": policy, "fleet.yaml": "replicas: []\n"})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml",
		ScrapeInterval: 20 * time.Millisecond, RedisAddrs: redis})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// repoPath is a file of the repository, by its path from the root.
func repoPath(t *testing.T, rel string) string {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}

// shippedBufferedTimeout is the ext_proc message timeout of deploy/envoy/envoy-buffered.yaml.
func shippedBufferedTimeout(t *testing.T) time.Duration {
	t.Helper()
	cfg, err := envoysim.LoadFile(repoPath(t, "deploy/envoy/envoy-buffered.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.ExtProc.GetMessageTimeout().AsDuration()
}

// asBuffered turns the shipped FULL_DUPLEX_STREAMED bootstrap into the BUFFERED one's processing modes, with
// the message timeout the shipped BUFFERED configs set.
func asBuffered(t *testing.T) func(string) string {
	timeout := shippedBufferedTimeout(t)
	return func(s string) string {
		s = strings.Replace(s, "request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: BUFFERED", 1)
		s = strings.Replace(s, "request_trailer_mode: SEND", "request_trailer_mode: SKIP", 1)
		s = strings.Replace(s, "response_body_mode: FULL_DUPLEX_STREAMED", "response_body_mode: STREAMED", 1)
		s = strings.Replace(s, "response_trailer_mode: SEND", "response_trailer_mode: SKIP", 1)
		return strings.Replace(s, "message_timeout: 10s", "message_timeout: "+timeout.String(), 1)
	}
}

// queued reads the gateway's admission queue length for m.
// readsBusy waits until the gateway has read the engine's queue at waiting: before that, on a busy machine, a
// request could be routed on no reading at all.
func readsBusy(t *testing.T, st *Stack, waiting float64) {
	t.Helper()
	wait.For(t, "the gateway to read the engine's queue", func() bool {
		total := 0.0
		for _, m := range scrape(t, st.MetricsURL)["infergate_endpoint_waiting_requests"].GetMetric() {
			total += m.GetGauge().GetValue()
		}
		return total == waiting
	})
}

func queued(t *testing.T, st *Stack) float64 {
	t.Helper()
	total := 0.0
	for _, m := range scrape(t, st.MetricsURL)["infergate_admission_queue_requests"].GetMetric() {
		total += m.GetGauge().GetValue()
	}
	return total
}

const admissionChat = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// Every shipped config that sends bodies BUFFERED (or STREAMED) arms Envoy's message timeout: it must be the
// timeout the policy's admission default assumes, or queued requests would meet Envoy's 504.
func TestShippedBufferedTimeoutsMatchThePolicyDefault(t *testing.T) {
	if got := shippedBufferedTimeout(t); got != policies.DefaultBufferedMessageTimeout {
		t.Errorf("envoy-buffered.yaml message_timeout %v, spec.admission.bufferedMessageTimeout defaults to %v", got, policies.DefaultBufferedMessageTimeout)
	}
	istio, err := os.ReadFile(repoPath(t, "deploy/istio/envoyfilter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The Istio filter streams (FULL_DUPLEX_STREAMED has no message timer); were it BUFFERED, its timeout must match.
	// Only the downstream filter, the first patch, queues: the fallback cluster's upstream ext_proc (which renames
	// the model on that leg) buffers its body and is answered at once.
	downstream, _, _ := strings.Cut(string(istio), "applyTo: CLUSTER")
	if !strings.Contains(downstream, "envoy.filters.http.ext_proc") {
		t.Fatal("deploy/istio/envoyfilter.yaml: no ext_proc filter before its clusters")
	}
	if strings.Contains(downstream, "request_body_mode: BUFFERED") && !strings.Contains(downstream, "message_timeout: "+policies.DefaultBufferedMessageTimeout.String()) {
		t.Errorf("deploy/istio/envoyfilter.yaml: BUFFERED without message_timeout: %v", policies.DefaultBufferedMessageTimeout)
	}
}

// In BUFFERED mode Envoy's message timeout bounds how long the processor may hold the routing answer: a
// request still queued when it nears is shed with the gateway's own 429, never Envoy's 504.
func TestBufferedQueueWaitEndsBeforeEnvoysTimeout(t *testing.T) {
	e := newBusyEngine(t)
	e.waiting.Store(5)
	st := admissionStack(t, e, asBuffered(t), "", nil)
	readsBusy(t, st, 5)
	start := time.Now()
	resp, body := postChat(t, st, admissionChat)
	elapsed := time.Since(start)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "model_overloaded") || resp.Header.Get("retry-after") == "" {
		t.Fatalf("got %d %s (retry-after %q), want the gateway's 429", resp.StatusCode, body, resp.Header.Get("retry-after"))
	}
	limit := policies.DefaultBufferedMessageTimeout
	if elapsed >= limit || elapsed < limit-policies.BufferedWaitMargin-100*time.Millisecond {
		t.Errorf("answered after %v: want the queue to hold it until %v before Envoy's %v", elapsed, limit-policies.BufferedWaitMargin, limit)
	}
	if e.received.Load() != 0 {
		t.Errorf("the engine got %d requests", e.received.Load())
	}
}

// In FULL_DUPLEX_STREAMED mode Envoy arms no message timeout: a request waits longer than any message timeout
// would allow and is served once the engine has room.
func TestFullDuplexQueueWaitOutlastsAMessageTimeout(t *testing.T) {
	e := newBusyEngine(t)
	e.waiting.Store(5)
	st := admissionStack(t, e, func(s string) string { return strings.Replace(s, "message_timeout: 10s", "message_timeout: 0.5s", 1) }, "", nil)
	readsBusy(t, st, 5)
	type answer struct {
		status int
		body   string
	}
	done := make(chan answer, 1)
	go func() {
		resp, body := postChat(t, st, admissionChat)
		done <- answer{resp.StatusCode, body}
	}()
	wait.For(t, "the request to queue", func() bool { return queued(t, st) == 1 })
	time.Sleep(time.Second) // the time passing is what is tested: twice the message timeout
	e.waiting.Store(0)
	select {
	case a := <-done:
		if a.status != http.StatusOK || e.received.Load() != 1 {
			t.Fatalf("got %d %s (engine saw %d), want it served after the wait", a.status, a.body, e.received.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued request was never answered")
	}
}

// A client that goes away while its request waits frees its concurrency slot in Redis at once, and the
// request never reaches the engine.
func TestAbortWhileQueuedFreesTheQuota(t *testing.T) {
	addr, stop, err := loadgen.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	e := newBusyEngine(t)
	e.waiting.Store(5)
	st := admissionStack(t, e, func(s string) string { return s }, ", quota: {maxConcurrent: 1}", []string{addr})
	readsBusy(t, st, 5)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.URL+"/v1/chat/completions", strings.NewReader(admissionChat))
	req.Header.Set("Authorization", "Bearer sk-demo-acme")
	req.Header.Set("Content-Type", "application/json")
	gone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	wait.For(t, "the request to queue", func() bool { return queued(t, st) == 1 })
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	slots := func() int64 {
		n, err := rdb.ZCard(context.Background(), "ig:{acme}:tenant:conc").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := slots(); n != 1 {
		t.Fatalf("the queued request holds %d concurrency slots in Redis, want 1", n)
	}
	cancel()
	<-gone
	wait.For(t, "the queue to let it go", func() bool { return queued(t, st) == 0 })
	// The slot goes back to Redis with the gateway's next settlement batch (quota.Limiter.Settle never waits on
	// Redis): a slot never given back would keep this wait from ending.
	wait.For(t, "the aborted request's concurrency slot to be given back", func() bool { return slots() == 0 })
	e.waiting.Store(0)
	// The one concurrency slot is free again: the next request is served, not refused.
	resp, body := postChat(t, st, admissionChat)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the abort: %d %s, want 200 (the aborted request still holds its concurrency slot?)", resp.StatusCode, body)
	}
	if n := e.received.Load(); n != 1 {
		t.Errorf("the engine got %d requests, want only the second", n)
	}
}

// admissionSeries says whether a series name or a query reads the admission queue's series, which appear only
// once a request has waited.
func admissionSeries(nameOrExpr string) bool {
	return strings.Contains(nameOrExpr, "infergate_admission_")
}

// Once a request has waited in the admission queue, every admission series the shipped dashboard and rules read
// is exported.
func TestAdmissionSeriesAreExported(t *testing.T) {
	e := newBusyEngine(t)
	e.waiting.Store(5)
	st := admissionStack(t, e, func(s string) string { return s }, "", nil)
	readsBusy(t, st, 5)
	done := make(chan int, 1)
	go func() {
		resp, _ := postChat(t, st, admissionChat)
		done <- resp.StatusCode
	}()
	wait.For(t, "the request to queue", func() bool { return queued(t, st) == 1 })
	e.waiting.Store(0)
	if status := <-done; status != http.StatusOK {
		t.Fatalf("the queued request got %d", status)
	}
	want := queriedSeries(t, admissionSeries)
	if len(want) < 4 {
		t.Fatalf("the dashboard and rules read %d admission series: %v", len(want), want)
	}
	if missing := unexported(t, st, want); len(missing) > 0 {
		t.Errorf("queried but not exported after a queued request: %v", missing)
	}
}
