package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/test/wait"
)

func TestDialects(t *testing.T) {
	f, err := os.Open("testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := Parse(f, MustDialect("vllm"))
	if err != nil {
		t.Fatal(err)
	}
	if v.BlockSize != 16 || v.NumBlocks != 512 || v.Running != 0 || v.Waiting != 0 || v.KVUtil != 0 || v.PromptTokens != 58 || v.CachedPromptTokens != 16 {
		t.Errorf("vllm fixture: %+v", v)
	}
	tests := []struct {
		engine, text string
		want         EngineMetrics
	}{
		{"sglang", "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 3\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 2\n# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n# TYPE sglang:cache_config_info gauge\nsglang:cache_config_info{page_size=\"32\",num_pages=\"900\"} 1\n",
			EngineMetrics{Running: 3, Waiting: 2, KVUtil: 0.5, BlockSize: 32, NumBlocks: 900}},
		{"trtllm", "trtllm_num_requests_running 4\ntrtllm_num_requests_waiting 1\ntrtllm_kv_cache_utilization 0.25\ntrtllm_kv_cache_tokens_per_block 64\ntrtllm_kv_cache_max_blocks 100\n",
			EngineMetrics{Running: 4, Waiting: 1, KVUtil: 0.25, BlockSize: 64, NumBlocks: 100}},
		{"vllm", "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.75\nvllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql-lora,chat-lora\",waiting_lora_adapters=\"\"} 1\n",
			EngineMetrics{KVUtil: 0.75, LoRAs: []string{"sql-lora", "chat-lora"}}},
		{"vllm", "# TYPE vllm:build_info gauge\nvllm:build_info{version=\"0.11.0\"} 1\n", EngineMetrics{Version: "0.11.0"}},
		{"sglang", "sglang:build_info{version=\"0.5.2\"} 1\n", EngineMetrics{Version: "0.5.2"}},
		// Counters summed over the engine's models.
		{"sglang", "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name=\"a\"} 700\nsglang:prompt_tokens_total{model_name=\"b\"} 300\n# TYPE sglang:cached_tokens_total counter\nsglang:cached_tokens_total{model_name=\"a\"} 400\n",
			EngineMetrics{PromptTokens: 1000, CachedPromptTokens: 400}},
		{"vllm", "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\"} 5000\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=\"m\"} 1024\n# TYPE vllm:external_prefix_cache_hits_total counter\nvllm:external_prefix_cache_hits_total{model_name=\"m\"} 2048\n",
			EngineMetrics{PromptTokens: 5000, CachedPromptTokens: 3072}},
		// Not a count of tokens: 0, as when not exported.
		{"vllm", "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"m\"} +Inf\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=\"m\"} 1e17\n",
			EngineMetrics{}},
	}
	for _, tc := range tests {
		got, err := Parse(strings.NewReader(tc.text), MustDialect(tc.engine))
		if err != nil {
			t.Fatalf("%s: %v", tc.engine, err)
		}
		if got.Running != tc.want.Running || got.Waiting != tc.want.Waiting || got.KVUtil != tc.want.KVUtil ||
			got.BlockSize != tc.want.BlockSize || got.NumBlocks != tc.want.NumBlocks || strings.Join(got.LoRAs, ",") != strings.Join(tc.want.LoRAs, ",") ||
			got.Version != tc.want.Version || got.PromptTokens != tc.want.PromptTokens || got.CachedPromptTokens != tc.want.CachedPromptTokens {
			t.Errorf("%s: got %+v, want %+v", tc.engine, got, tc.want)
		}
	}
	if _, err := Parse(strings.NewReader("not a metric line {{{"), MustDialect("vllm")); err == nil {
		t.Error("garbage parsed")
	}
}

func TestScraperAgainstSimulatedReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fl, err := fleetsim.Start(ctx, fleetsim.Config{TimeScale: 0.1, Replicas: []fleetsim.ReplicaConfig{
		{Name: "v", Addr: "127.0.0.1:0", Model: "m", Hardware: "h200", NumGPUBlocks: 777, EngineVersion: "0.11.0"},
		{Name: "s", Addr: "127.0.0.1:0", Model: "m", Hardware: "l40s", Dialect: "sglang", NumGPUBlocks: 555, BlockSize: 32},
	}})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := fl.Replica("v")
	sg, _ := fl.Replica("s")
	var clock atomic.Int64 // nanoseconds past a fixed start
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sc := &Scraper{Interval: 20 * time.Millisecond, StaleAfter: 200 * time.Millisecond,
		Now: func() time.Time { return start.Add(time.Duration(clock.Load())) }}
	sc.SetTargets([]Target{{v.Addr(), MustDialect("vllm")}, {sg.Addr(), MustDialect("sglang")}})
	sctx, stop := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { sc.Run(sctx); close(runDone) }()
	wait.For(t, "both replicas scraped", func() bool {
		mv, okv := sc.Metrics(v.Addr())
		ms, oks := sc.Metrics(sg.Addr())
		return okv && oks && mv.NumBlocks == 777 && ms.NumBlocks == 555 && ms.BlockSize == 32
	})
	if mv, _ := sc.Metrics(v.Addr()); mv.Version != "0.11.0" {
		t.Errorf("the simulated engine's version %q", mv.Version)
	}
	stop() // no more scrapes: once the clock passes StaleAfter, readings are stale
	<-runDone
	clock.Add(int64(201 * time.Millisecond))
	if _, fresh := sc.Metrics(v.Addr()); fresh {
		t.Error("a reading older than StaleAfter still counts as fresh")
	}
	if _, fresh := sc.Metrics("10.9.9.9:1"); fresh {
		t.Error("an endpoint never scraped counts as fresh")
	}
}

// An engine in another region answers its scrape after more than an interval: it is still read (the scrape's
// timeout is the stale age less an interval), and the engines near by are read every round meanwhile, not held
// back by it. The relay hears every target in every round: the far one by its last reading while it is read.
func TestAFarEngineIsReadWithoutSlowingTheNearOnes(t *testing.T) {
	exposition, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	var near, far atomic.Int64
	release := make(chan struct{}) // closed at the end: the far engine stops waiting
	defer close(release)
	serve := func(count *atomic.Int64, delay bool) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if delay {
				select { // three intervals of round trip
				case <-time.After(120 * time.Millisecond):
				case <-release:
				}
			}
			count.Add(1)
			_, _ = w.Write(exposition)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	nearAddr, farAddr := serve(&near, false), serve(&far, true)
	pub := &heardRounds{}
	sc := &Scraper{Interval: 40 * time.Millisecond, Relay: pub} // stale after 200 ms, a scrape may take 160
	sc.SetTargets([]Target{{nearAddr, MustDialect("vllm")}, {farAddr, MustDialect("vllm")}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { sc.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wait.For(t, "the far engine read three times", func() bool { return far.Load() >= 3 })
	if _, fresh := sc.Metrics(farAddr); !fresh {
		t.Error("the far engine's reading is not fresh")
	}
	if n, f := near.Load(), far.Load(); n < 2*f {
		t.Errorf("near engine read %d times while the far one was read %d: the far one holds the rounds back", n, f)
	}
	if incomplete := pub.incomplete.Load(); incomplete > 0 {
		t.Errorf("%d rounds went to the relay without every target", incomplete)
	}
}

// heardRounds is a relay that counts the rounds it hears that miss a target.
type heardRounds struct{ incomplete atomic.Int64 }

func (h *heardRounds) Skip() bool { return false }

func (h *heardRounds) Publish(rs []Reading) {
	if len(rs) != 2 {
		h.incomplete.Add(1)
	}
}

func FuzzParse(f *testing.F) {
	b, _ := os.ReadFile("testdata/vllm-metrics.txt")
	f.Add(string(b), "vllm")
	f.Add("sglang:token_usage 0.5\n", "sglang")
	f.Add("trtllm_kv_cache_max_blocks 1e3\n", "trtllm")
	f.Fuzz(func(t *testing.T, text, engine string) {
		ds := Dialects() // an unknown engine name: every dialect reads the text
		if d, ok := DialectFor(engine); ok {
			ds = []Dialect{d}
		}
		for _, d := range ds {
			_, _ = Parse(strings.NewReader(text), d) // must not panic
		}
	})
}
