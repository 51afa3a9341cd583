package fleetsim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestKVCache(t *testing.T) {
	tokens := strings.Fields(strings.Repeat("a b c d ", 16)) // 64 tokens = 4 blocks of 16
	other := strings.Fields(strings.Repeat("x y z w ", 16))
	h := blockHashes(tokens, 16)
	o := blockHashes(other, 16)
	if len(h) != 4 || h[0] == h[1] {
		t.Fatalf("hashes must chain: %v", h)
	}
	c := newKVCache(16, 10)
	if hit, ok := c.allocate(h, 2); !ok || hit != 0 {
		t.Fatalf("cold allocate: hit=%d ok=%v", hit, ok)
	}
	if hit, _ := c.allocate(h, 0); hit != 0 {
		t.Fatalf("blocks still being prefilled must not count as hits, got %d", hit)
	}
	c.release(h, 0)
	c.markComputed(h)
	if c.used != 6 {
		t.Fatalf("used = %d, want 6 (4 shared + 2 private)", c.used)
	}
	// The KV wall: 4 new blocks + 1 private do not fit next to 6 used.
	if _, ok := c.allocate(o, 1); ok {
		t.Fatal("allocation beyond capacity succeeded")
	}
	c.release(h, 2)
	if c.used != 0 || c.lru.Len() != 4 {
		t.Fatalf("after release used=%d lru=%d", c.used, c.lru.Len())
	}
	if hit, ok := c.allocate(h, 0); !ok || hit != 4 {
		t.Fatalf("warm allocate: hit=%d ok=%v, want all 4 blocks", hit, ok)
	}
	c.release(h, 0)
	// A different prompt needing 8 blocks evicts the LRU cached blocks to make room.
	if _, ok := c.allocate(o, 4); !ok {
		t.Fatal("eviction did not make room")
	}
	// Two of the prompt's four blocks had to go: its tail, since vLLM frees a request's blocks tail first, so
	// the head (a shared system prompt) is evicted last and the two blocks left still match.
	if got := c.matched(h); got != 2 {
		t.Errorf("after evicting two blocks %d leading blocks match, want 2 (tail evicted first)", got)
	}
}

func startReplica(t *testing.T, cfg ReplicaConfig, scale float64) *Replica {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	r, err := NewReplica(cfg, scale)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

type chatResult struct {
	ttft   time.Duration
	usage  usage
	status int
	body   string
}

// chat sends a streaming chat request and measures time to the first content chunk.
func chat(t *testing.T, client *http.Client, base, model, system, user string, maxTokens int) chatResult {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": maxTokens,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
	start := time.Now()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	res := chatResult{status: resp.StatusCode}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		res.body = string(b)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *usage            `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line[6:]), &chunk); err != nil {
			t.Fatalf("bad chunk %q: %v", line, err)
		}
		if res.ttft == 0 && len(chunk.Choices) > 0 {
			res.ttft = time.Since(start)
		}
		if chunk.Usage != nil {
			res.usage = *chunk.Usage
		}
	}
	return res
}

func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics not in the Prometheus text format: %v", err)
	}
	return fams
}

func value(fams map[string]*dto.MetricFamily, name string) float64 {
	f := fams[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return -1
	}
	m := f.GetMetric()[0]
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

// systemPrompt is long (about 2,100 tokens) so that prefill time dominates scheduling noise on a busy machine.
var systemPrompt = strings.Repeat("You are a careful assistant for the infergate test suite and answer in one line. ", 150)

func TestRepeatedPrefixLowersTTFT(t *testing.T) {
	r := startReplica(t, ReplicaConfig{Name: "r0", Model: "m", Hardware: "l40s"}, 0.5)
	base := "http://" + r.Addr()
	start := time.Now()
	cold := chat(t, http.DefaultClient, base, "m", systemPrompt, "first question", 4)
	warm := chat(t, http.DefaultClient, base, "m", systemPrompt, "second question", 4)
	if cold.status != 200 || warm.status != 200 {
		t.Fatalf("status %d / %d", cold.status, warm.status)
	}
	if cold.usage.PromptTokensDetails.CachedTokens != 0 || warm.usage.PromptTokensDetails.CachedTokens < cold.usage.PromptTokens*8/10 {
		t.Fatalf("cached tokens cold=%d warm=%d of %d", cold.usage.PromptTokensDetails.CachedTokens,
			warm.usage.PromptTokensDetails.CachedTokens, warm.usage.PromptTokens)
	}
	if warm.ttft*3 > cold.ttft {
		t.Errorf("warm TTFT %v is not well below cold TTFT %v", warm.ttft, cold.ttft)
	}
	// Busy time is simulated (real ÷ 0.5): at least the cold request's real TTFT, at most the simulated time the
	// two requests took.
	if busy, elapsed := r.BusyTime(), time.Duration(float64(time.Since(start))/0.5); busy < cold.ttft || busy > elapsed {
		t.Errorf("busy time %v: want between the cold TTFT %v and the %v elapsed", busy, cold.ttft, elapsed)
	}
	fams := scrape(t, base)
	queries, hits := value(fams, "vllm:prefix_cache_queries_total"), value(fams, "vllm:prefix_cache_hits_total")
	if queries != float64(cold.usage.PromptTokens+warm.usage.PromptTokens) || hits != float64(warm.usage.PromptTokensDetails.CachedTokens) {
		t.Errorf("prefix cache metrics queries=%v hits=%v", queries, hits)
	}
	if value(fams, "vllm:time_to_first_token_seconds") != 2 {
		t.Errorf("ttft histogram count = %v", value(fams, "vllm:time_to_first_token_seconds"))
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:cache_config_info", "vllm:lora_requests_info"} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	if fams["vllm:num_requests_running"].GetType() != dto.MetricType_GAUGE || fams["vllm:prefix_cache_hits_total"].GetType() != dto.MetricType_COUNTER {
		t.Error("metric types wrong")
	}
}

func TestConcurrentPrefillsShareThroughput(t *testing.T) {
	r := startReplica(t, ReplicaConfig{Name: "r0", Model: "m", Hardware: "l40s"}, 0.5)
	base := "http://" + r.Addr()
	alone := chat(t, http.DefaultClient, base, "m", "alpha "+systemPrompt, "q", 2)
	var wg sync.WaitGroup
	res := make([]chatResult, 4)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = chat(t, http.DefaultClient, base, "m", fmt.Sprintf("beta%d %s", i, systemPrompt), "q", 2)
		}()
	}
	wg.Wait()
	slowest := time.Duration(0)
	for _, c := range res {
		slowest = max(slowest, c.ttft)
	}
	if slowest < alone.ttft*3 {
		t.Errorf("four concurrent cold prompts: slowest TTFT %v, alone %v; prefill throughput is not shared", slowest, alone.ttft)
	}
}

func TestFaultsAndEndpoints(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := Start(ctx, Config{TimeScale: 0.05, AdminAddr: "127.0.0.1:0", Replicas: []ReplicaConfig{
		{Name: "a", Addr: "127.0.0.1:0", Model: "m", Hardware: "h200"},
		{Name: "s", Addr: "127.0.0.1:0", Model: "m", Hardware: "h100", Dialect: "sglang"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.Replica("a")
	base := "http://" + a.Addr()
	setFaults := func(faults string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, "http://"+f.AdminAddr()+"/faults/a", strings.NewReader(faults))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("set faults: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	setFaults(`{"errorRate":1}`)
	if res := chat(t, http.DefaultClient, base, "m", "s", "u", 2); res.status != 500 {
		t.Errorf("error rate 1: status %d", res.status)
	}
	setFaults(`{"refuse":true}`)
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("refuse: connection accepted")
	}
	setFaults(`{}`)
	if res := chat(t, http.DefaultClient, base, "m", "s", "u", 2); res.status != 200 {
		t.Errorf("after clearing faults: status %d %s", res.status, res.body)
	}
	setFaults(`{"hang":true}`)
	hc := &http.Client{Timeout: 300 * time.Millisecond}
	if _, err := hc.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`)); err == nil {
		t.Error("hang: got an answer")
	}
	setFaults(`{}`)

	if res := chat(t, http.DefaultClient, base, "other-model", "s", "u", 2); res.status != 404 || !strings.Contains(res.body, "NotFoundError") {
		t.Errorf("unknown model: %d %s", res.status, res.body)
	}
	for path, body := range map[string]string{
		"/v1/completions": `{"model":"m","prompt":"once upon a time","max_tokens":3}`,
		"/v1/embeddings":  `{"model":"m","input":"embed me"}`,
	} {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Usage usage `json:"usage"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != 200 || out.Usage.PromptTokens == 0 {
			t.Errorf("%s: %d %+v", path, resp.StatusCode, out.Usage)
		}
	}
	s, _ := f.Replica("s")
	fams := scrape(t, "http://"+s.Addr())
	for _, name := range []string{"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_config_info"} {
		if fams[name] == nil {
			t.Errorf("sglang metric %s missing", name)
		}
	}
}

func TestManagedAPI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := StartManaged(ctx, ManagedConfig{Name: "together", Addr: "127.0.0.1:0", Model: "provider/Llama-Turbo", APIKey: "secret"}, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(m.CertPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	base := "https://" + m.Addr()
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"provider/Llama-Turbo","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("without key: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"provider/Llama-Turbo","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer secret")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":3`) {
		t.Errorf("with key: %d %s", resp.StatusCode, b)
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("plain client trusted the self-signed certificate")
	}
}

// A replica's speed block replaces its hardware profile, durations written as Go durations.
func TestReplicaSpeedFromTheFleetFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, []byte(`replicas:
- {name: small, addr: "127.0.0.1:0", model: m, hardware: l40s, speed: {prefillTokensPerSecond: 40000, decodeStep: 12ms, decodeStepPerSeq: 100us, stepOverhead: 1ms}}
- {name: bad, addr: "127.0.0.1:0", model: m, hardware: l40s, speed: {decodeStep: 12ms}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Hardware{PrefillTokensPerSecond: 40000, DecodeStep: 12 * time.Millisecond, DecodeStepPerSeq: 100 * time.Microsecond, StepOverhead: time.Millisecond}
	if got := *cfg.Replicas[0].Speed; got != want {
		t.Errorf("speed %+v, want %+v", got, want)
	}
	if _, err := NewReplica(cfg.Replicas[1], 1); err == nil {
		t.Error("a speed without a prefill rate was accepted")
	}
}
