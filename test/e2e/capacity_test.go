package e2e

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/capacity"
)

// `infergate plan --live` against a gateway under traffic: every quickstart pool with its engines' KV
// capacity, the served pool's request rate, hit rate and TTFT p95, and the autoscaling signal.
func TestPlanLiveReadsARunningGateway(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: root, EnvoyFile: envoyConfigs["full-duplex"], PolicyFile: "examples/quickstart/policy.yaml",
		FleetFile: "examples/quickstart/fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	system := strings.Repeat("You are terse, and every request shares this long system prompt. ", 20)
	load, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(st, "sk-demo-globex")
			for load.Err() == nil {
				s := c.Chat.Completions.NewStreaming(load, chatParams(qwen, system, "hello"))
				for s.Next() {
				}
				_ = s.Close()
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	report, err := capacity.ReadLive(ctx, strings.TrimSuffix(st.MetricsURL, "/metrics"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	byPool := map[string]capacity.LivePool{}
	for _, p := range report.Pools {
		byPool[p.Pool] = p
	}
	for _, name := range []string{"llama70b-h200", "llama70b-l40s", "qwen7b-l40s"} {
		p, ok := byPool[name]
		if !ok || p.Replicas != 2 || p.KVCapacityTokens <= 0 || p.DesiredReplicas < 2 || p.Headroom <= 0 || p.Headroom > 1 {
			t.Errorf("%s: %+v", name, p)
		}
	}
	if q := byPool["qwen7b-l40s"]; q.RequestsPerSecond <= 0 || q.TTFTP95 <= 0 || q.HitRate <= 0 {
		t.Errorf("the served pool: %+v", q)
	}
	var out bytes.Buffer
	capacity.RenderLive(&out, report)
	if !strings.Contains(out.String(), "qwen7b-l40s") || !strings.Contains(out.String(), "KV TOKENS") {
		t.Errorf("table:\n%s", out.String())
	}
	t.Logf("\n%s", out.String())
}
