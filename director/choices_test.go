package director

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/test/redistest"
)

// Two gateways — each its own director and quota limiter, on one Redis — take 32 clients' requests for up to
// 16 completions each (n), and a simulated engine generates every sequence to max_tokens, as vLLM does. What
// the engine generated in the window stays within 1 % of the tenant's tokens-per-minute limit: admission
// reserves every sequence. (Reserving one sequence let such clients through at several times the limit.)
func TestChoicesStayWithinTheTokenLimit(t *testing.T) {
	const limit, maxTokens = 6000, 20
	raw, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte("quota: {requestsPerSecond: 50, tokensPerMinute: 2000000, maxConcurrent: 64, monthlySpendUSD: 20000}"),
		[]byte(fmt.Sprintf("quota: {tokensPerMinute: %d}", limit)), 1)
	// Redis answers slowly under the race detector: a generous timeout keeps the limiters on the shared path
	// (the fail-open path, each replica allowed its share, is another test's).
	raw = bytes.Replace(raw, []byte("redisTimeout: 50ms"), []byte("redisTimeout: 5s"), 1)
	snap, err := policies.Parse("policy.yaml", raw)
	if err != nil {
		t.Fatal(err)
	}
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := redistest.Start(t)
	window := time.Date(2026, 12, 3, 10, 0, 20, 0, time.UTC) // one window: every admission in the same minute
	now := func() time.Time { return window }
	var gateways []*Director
	var limiters []*quota.Limiter
	for range 2 {
		lim := quota.New(ctx, quota.Options{Addrs: []string{srv.Addr}, Now: now})
		limiters = append(limiters, lim)
		gateways = append(gateways, New(Options{Policies: policies.NewStaticStore(snap), Admission: lim, Now: now}))
	}
	model, _ := snap.Model("llama-3.3-70b")
	engine, err := fleetsim.NewReplica(fleetsim.ReplicaConfig{Name: "e", Addr: "127.0.0.1:0", Model: model.Pools[0].ServedModel,
		Hardware: "h200", MaxNumSeqs: 256}, 0.001)
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var generated, routed, refused atomic.Int64
	var wg sync.WaitGroup
	for c := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for range 40 {
				body := fmt.Sprintf(`{"model":"llama-3.3-70b","n":%d,"max_tokens":%d,"messages":[{"role":"user","content":"client %d asks"}]}`,
					1+rng.IntN(16), maxTokens, c)
				u, ok := gatewayTurn(t, gateways[c%2], snap, tenant, body, engine.Addr())
				if !ok {
					refused.Add(1)
					continue
				}
				routed.Add(1)
				generated.Add(u.Total())
			}
		}()
	}
	wg.Wait()
	for i, lim := range limiters {
		if !lim.Up() {
			t.Fatalf("gateway %d lost Redis during the test: its figures are the fail mode's, not admission's", i)
		}
	}
	got := generated.Load()
	t.Logf("%d requests served, %d refused; the engine generated %d tokens against a limit of %d", routed.Load(), refused.Load(), got, limit)
	if float64(got) > 1.01*limit {
		t.Errorf("the engine generated %d tokens in one window of a %d tokens-per-minute limit (%.0f %%)", got, limit, 100*float64(got)/limit)
	}
	if refused.Load() == 0 || float64(got) < 0.5*limit {
		t.Errorf("the limit was never reached (%d tokens, %d refusals): the test checks nothing", got, refused.Load())
	}
}

// gatewayTurn routes one request through d, sends its rewritten body to the engine at addr as Envoy would,
// and settles it with the engine's usage; ok is false when the director refused it.
func gatewayTurn(t *testing.T, d *Director, snap *policies.Snapshot, tenant *policies.Tenant, raw, addr string) (openai.Usage, bool) {
	body, err := openai.ParseRequest(openai.EndpointChat, []byte(raw))
	if err != nil {
		t.Error(err)
		return openai.Usage{}, false
	}
	defer body.Release()
	rt := &Route{}
	if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body}, rt); err != nil {
		return openai.Usage{}, false
	}
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(body.Rewrite(nil, rt.Edits)))
	if err != nil {
		t.Error(err)
		d.Settle(rt, Outcome{Status: 0})
		return openai.Usage{}, false
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	u, reported := openai.UsageFromJSON(answer)
	if err != nil || resp.StatusCode != 200 || !reported {
		t.Errorf("engine answered %d without usage: %v %s", resp.StatusCode, err, answer)
	}
	d.Settle(rt, Outcome{Status: resp.StatusCode, Usage: u, Reported: reported, BodySeen: true})
	return u, true
}
