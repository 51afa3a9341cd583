package quota

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// policyHead is the tests' policy up to its tenants: one model on one pool, with the quota settings given.
func policyHead(settings string) string {
	return `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  quotas: {` + settings + `}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: m
    pricing: {inputPerMTok: 1, outputPerMTok: 2}
    pools:
    - {name: a, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:8000"]}
  tenants:
`
}

// policy is a one-tenant policy with the quota and quotas settings given. Tests of what Redis counts set a
// long redisTimeout: at the default a call that a busy machine delays past it meets the fail mode and is
// admitted in process (TestSettlementRefundsAndCharges was, beside two CPU hogs), which is another test's
// subject.
func policy(t testing.TB, quota, settings string) (*policies.Snapshot, *policies.Tenant, *policies.Model) {
	t.Helper()
	src := policyHead(settings) + `  - name: acme
    apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"]
    models: ["*"]
    quota: {` + quota + `}
`
	snap, err := policies.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	tn, _ := snap.TenantForKey("sk-demo-acme")
	m, _ := snap.Model("m")
	return snap, tn, m
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func newLimiter(t *testing.T, addr string, cluster bool, c *clock) *Limiter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o := Options{Addrs: []string{addr}, Cluster: cluster}
	if c != nil {
		// Tests on a fake clock renew slots by hand (renewSlots), never on a real-time ticker.
		o.Now, o.RenewInterval = c.Now, -1
	}
	return New(ctx, o)
}

func req(snap *policies.Snapshot, tn *policies.Tenant, m *policies.Model, tokens int64) Request {
	return Request{Snapshot: snap, Tenant: tn, Model: m, EstimatedTokens: tokens, EstimatedCostMicros: tokens}
}

// 256 concurrent streams against a tokens-per-minute limit and a concurrency limit: the admitted work never
// overshoots (≤ 1 %), and settlement refunds what was not used.
func TestConcurrentAdmissionIsAtomic(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "tokensPerMinute: 10000, maxConcurrent: 16", "redisTimeout: 5s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	l := newLimiter(t, srv.Addr, false, c)

	var admitted, refused, inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
			if err != nil {
				t.Error(err)
				refused.Add(1)
				return
			}
			if rej != nil {
				refused.Add(1)
				return
			}
			admitted.Add(1)
			n := inFlight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			inFlight.Add(-1)
			l.Settle(tk, 100, 100)
		}()
	}
	wait.For(t, "every first attempt answered", func() bool { return admitted.Load()+refused.Load() == 256 })
	if peak.Load() > 16 {
		t.Errorf("peak concurrency %d over the limit of 16", peak.Load())
	}
	close(release)
	wg.Wait()

	// With concurrency freed, tokens per minute binds: 10,000 / 100 = 100 requests, minus the 16 already in.
	wait.For(t, "settlements flushed", func() bool { v, _ := srv.Do("ZCARD", concKey(tn)); return v == "0" })
	var more atomic.Int64
	for range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
				switch {
				case err != nil:
					t.Error(err)
					return
				case rej == nil:
					more.Add(1)
					l.Settle(tk, 100, 100)
					return
				case rej.Kind == KindTokens:
					return // the limit that must bind
				}
				time.Sleep(time.Millisecond) // a concurrency slot: wait for one to free
			}
		}()
	}
	wg.Wait()
	total := admitted.Load() + more.Load()
	if total > 101 || total < 100 {
		t.Errorf("admitted %d requests of 100 tokens under a 10,000 TPM limit", total)
	}
}

func concKey(tn *policies.Tenant) string { return "ig:" + tag(tn.Name) + ":tenant:conc" }

func TestSettlementRefundsAndCharges(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "tokensPerMinute: 1000, monthlySpendUSD: 1", "redisTimeout: 5s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	l := newLimiter(t, srv.Addr, false, c)
	tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 600))
	if err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	// A second 600 does not fit next to the reservation ...
	if _, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 600)); rej == nil || rej.Kind != KindTokens {
		t.Fatalf("want a tokens rejection, got %+v", rej)
	}
	// ... but after settling at 150 real tokens it does.
	l.Settle(tk, 150, 150)
	key := "ig:" + tag(tn.Name) + ":tenant:tpm:" + windowID(c.Now(), time.Minute)
	wait.For(t, "refund", func() bool { v, _ := srv.Do("GET", key); return v == "150" })
	if _, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 600)); rej != nil {
		t.Fatalf("rejected after refund: %+v", rej)
	}
	ttl, _ := srv.Do("PTTL", key)
	if ttl == "-1" {
		t.Error("window counter without expiry")
	}
}

func TestWindowRollover(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "requestsPerSecond: 3", "redisTimeout: 5s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 100e6, time.UTC)}
	l := newLimiter(t, srv.Addr, false, c)
	admit := func() *Rejection {
		_, rej, err := l.Admit(context.Background(), req(snap, tn, m, 10))
		if err != nil {
			t.Fatal(err)
		}
		return rej
	}
	for i := range 3 {
		if rej := admit(); rej != nil {
			t.Fatalf("request %d rejected: %+v", i, rej)
		}
	}
	rej := admit()
	if rej == nil || rej.Kind != KindRequests || rej.Limit != 3 || rej.Reset != 900*time.Millisecond {
		t.Fatalf("want rps rejection resetting in 900ms, got %+v", rej)
	}
	c.Advance(time.Second)
	if rej := admit(); rej != nil {
		t.Fatalf("new window still rejected: %+v", rej)
	}
}

func TestMonthlySpendIsInsufficientQuota(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "monthlySpendUSD: 0.001", "redisTimeout: 5s") // 1,000 micro-USD
	l := newLimiter(t, srv.Addr, false, nil)
	r := req(snap, tn, m, 10)
	r.EstimatedCostMicros = 800
	if _, rej, _ := l.Admit(context.Background(), r); rej != nil {
		t.Fatal(rej)
	}
	_, rej, _ := l.Admit(context.Background(), r)
	if rej == nil || rej.Kind != KindSpend || rej.Limit != 1000 {
		t.Fatalf("want a spend rejection, got %+v", rej)
	}
}

// Redis killed mid-test: fail open admits under the local limiter (limit ÷ replicas), fail closed refuses;
// both recover by themselves when Redis is back.
func TestRedisOutage(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			snap, tn, m := policy(t, "requestsPerSecond: 100", "failMode: "+mode+", redisTimeout: 100ms, gatewayReplicas: 4")
			// A fixed clock keeps every admission in one window: on a real clock the 100 attempts below
			// could straddle a second boundary and see two windows' worth of local allowance.
			l := newLimiter(t, srv.Addr, false, &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 100e6, time.UTC)})
			if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1)); err != nil || rej != nil {
				t.Fatal(rej, err)
			}
			srv.Kill()
			_, _, err := l.Admit(context.Background(), req(snap, tn, m, 1))
			for range downAfterFailures - 1 { // the fail mode applies at once; "down" needs a few failures
				_, _, _ = l.Admit(context.Background(), req(snap, tn, m, 1))
			}
			if mode == "closed" {
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("fail closed: err %v", err)
				}
			} else {
				if err != nil {
					t.Fatalf("fail open: err %v", err)
				}
				admitted := 1 // the one above
				for range 100 {
					if _, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 1)); rej == nil {
						admitted++
					}
				}
				if admitted < 20 || admitted > 30 {
					t.Errorf("local limiter admitted %d in one second, want about 100 ÷ 4 replicas", admitted)
				}
			}
			if l.Up() {
				t.Error("still up after Redis died")
			}
			if got := testutil.ToFloat64(l.metrics.Transitions.WithLabelValues("down")); got != 1 {
				t.Errorf("down transitions = %v", got)
			}
			if testutil.ToFloat64(l.metrics.BackendUp) != 0 {
				t.Error("backend_up not 0 while down")
			}
			srv.Restart()
			wait.For(t, "recovery", l.Up)
			if got := testutil.ToFloat64(l.metrics.Transitions.WithLabelValues("up")); got != 1 {
				t.Errorf("up transitions = %v", got)
			}
			tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1))
			if err != nil || rej != nil || tk.local {
				t.Fatalf("after recovery: %+v %+v %v", tk, rej, err)
			}
		})
	}
}

// Redis Cluster: every key of a tenant carries its hash tag, so the scripts run in one slot.
func TestCluster(t *testing.T) {
	srv := redistest.StartCluster(t)
	snap, tn, m := policy(t, "requestsPerSecond: 5, tokensPerMinute: 1000, maxConcurrent: 2, monthlySpendUSD: 10", "redisTimeout: 5s")
	l := newLimiter(t, srv.Addr, true, nil)
	tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
	if err != nil || rej != nil {
		t.Fatalf("cluster admission: %+v %v", rej, err)
	}
	for _, e := range tk.entries {
		slot, err := srv.Do("CLUSTER", "KEYSLOT", e.key)
		first, _ := srv.Do("CLUSTER", "KEYSLOT", tk.entries[0].key)
		if err != nil || slot != first {
			t.Errorf("key %s in slot %s, first key in %s (%v)", e.key, slot, first, err)
		}
	}
	before := l.RoundTrips()
	l.Settle(tk, 50, 50)
	wait.For(t, "cluster settlement", func() bool { v, _ := srv.Do("ZCARD", concKey(tn)); return v == "0" })
	if l.RoundTrips() == before {
		t.Error("settlement sent nothing")
	}
}

// A reservation that is never settled (a gateway crashed) stops holding its concurrency slot after the TTL.
func TestUnsettledReservationExpires(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "maxConcurrent: 1", "redisTimeout: 2s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	l := newLimiter(t, srv.Addr, false, c)
	if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1)); err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	if _, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 1)); rej == nil || rej.Kind != KindConcurrency {
		t.Fatalf("want a concurrency rejection, got %+v", rej)
	}
	c.Advance(ConcurrencyTTL + time.Second)
	if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1)); err != nil || rej != nil {
		t.Fatalf("the expired reservation still holds the slot: %+v %v", rej, err)
	}
}

// Limits per tenant × model and per conversation apply on top of the tenant-wide quota.
func TestModelAndConversationLimits(t *testing.T) {
	srv := redistest.Start(t)
	src := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  quotas: {conversationHeader: x-conversation-id, redisTimeout: 2s}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - {name: m, pools: [{name: a, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:8000"]}]}
  - {name: n, pools: [{name: b, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.2:8000"]}]}
  tenants:
  - name: acme
    apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"]
    models: ["*"]
    quota: {requestsPerSecond: 100, conversationTokens: 150}
    modelQuotas: [{model: m, requestsPerSecond: 1}]
`
	snap, err := policies.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	tn, _ := snap.TenantForKey("sk-demo-acme")
	m, _ := snap.Model("m")
	n, _ := snap.Model("n")
	l := newLimiter(t, srv.Addr, false, &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)})
	admit := func(model *policies.Model, conv string) *Rejection {
		r := req(snap, tn, model, 100)
		r.Conversation = conv
		_, rej, err := l.Admit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return rej
	}
	if rej := admit(m, ""); rej != nil {
		t.Fatal(rej)
	}
	if rej := admit(m, ""); rej == nil || rej.Scope != "model:m" || rej.Kind != KindRequests {
		t.Fatalf("want the model's rps limit, got %+v", rej)
	}
	if rej := admit(n, ""); rej != nil {
		t.Fatalf("another model is not limited by m's quota: %+v", rej)
	}
	if rej := admit(n, "conv-1"); rej != nil {
		t.Fatal(rej)
	}
	rej := admit(n, "conv-1")
	if rej == nil || rej.Kind != KindConversation {
		t.Fatalf("want the conversation cap, got %+v", rej)
	}
	if rej := admit(n, "conv-2"); rej != nil {
		t.Fatalf("another conversation is not capped: %+v", rej)
	}
}

func TestRPSWindow(t *testing.T) {
	for _, tc := range []struct {
		rps    float64
		window time.Duration
		limit  int64
	}{
		{100, time.Second, 100},
		{2.5, 2 * time.Second, 5},
		{0.5, 2 * time.Second, 1},
		{0.3, 4 * time.Second, 1},
		{1.25, 4 * time.Second, 5},
		{3.14159, time.Second, 3}, // no whole count within 10 s: floored
	} {
		w, l := rpsWindow(tc.rps)
		if w != tc.window || l != tc.limit {
			t.Errorf("rpsWindow(%v) = %v, %d; want %v, %d", tc.rps, w, l, tc.window, tc.limit)
		}
	}
}

// A Redis that requires a password (as the chart's does) admits through a limiter given it; one without it
// gets Redis's refusal, and the fail mode answers.
func TestRedisWithAPassword(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := srv.Do("CONFIG", "SET", "requirepass", "a-generated-password"); err != nil {
		t.Fatal(err)
	}
	snap, tn, m := policy(t, "requestsPerSecond: 100", "redisTimeout: 5s, failMode: closed, leaseFraction: 0")
	limiter := func(password string) *Limiter {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		return New(ctx, Options{Addrs: []string{srv.Addr}, Password: password, RenewInterval: -1})
	}
	authed := limiter("a-generated-password")
	tk, rej, err := authed.Admit(context.Background(), req(snap, tn, m, 10))
	if err != nil || rej != nil {
		t.Fatalf("with the password: %v %v", rej, err)
	}
	authed.Settle(tk, 5, 5)
	if _, rej, err := limiter("").Admit(context.Background(), req(snap, tn, m, 10)); err == nil && rej == nil {
		t.Error("admitted without the password")
	}
}
