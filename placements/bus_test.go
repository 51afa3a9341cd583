package placements

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/pubsub"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

const policy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {l40s: {costPerHour: 1.1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}}
  models:
  - name: m
    pools:
    - {name: a, hardwareClass: l40s, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// testSnap parses the test policy.
func testSnap(t *testing.T) (*policies.Snapshot, *policies.Model) {
	t.Helper()
	snap, err := policies.Parse("p.yaml", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	return snap, m
}

// replica is one gateway's picker on the bus.
type replica struct {
	picker *picker.Affinity
	bus    *Bus
	reg    *prometheus.Registry
}

func startReplica(t *testing.T, ctx context.Context, addr string, snap *policies.Snapshot, wg *sync.WaitGroup) replica {
	t.Helper()
	return startReplicaOn(t, ctx, redis.NewClient(&redis.Options{Addr: addr}), snap, wg)
}

// startReplicaOn starts a replica on client (closed at the test's end) and waits for its subscription.
func startReplicaOn(t *testing.T, ctx context.Context, client redis.UniversalClient, snap *policies.Snapshot, wg *sync.WaitGroup) replica {
	t.Helper()
	t.Cleanup(func() { _ = client.Close() })
	r := replica{picker: picker.NewAffinity(&fleet.InFlight{}, nil), reg: prometheus.NewRegistry()}
	r.picker.PolicyChanged(snap)
	r.bus = New(Options{Client: client, Metrics: NewMetrics(r.reg)})
	r.picker.Placements = r.bus
	r.picker.ChurnEvery = -1 // placements only; TestChurnOverRedis reports churn
	wg.Go(func() { r.bus.Run(ctx, r.picker.Learn) })
	select {
	case <-r.bus.Ready():
	case <-ctx.Done():
		t.Fatal("never subscribed")
	}
	return r
}

// twoReplicas starts a redis-server and two replicas on it, stopped when the test ends.
func twoReplicas(t *testing.T) (*redistest.Server, *policies.Snapshot, *policies.Model, replica, replica) {
	t.Helper()
	srv := redistest.Start(t)
	snap, m := testSnap(t)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	a := startReplica(t, ctx, srv.Addr, snap, &wg)
	b := startReplica(t, ctx, srv.Addr, snap, &wg)
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the clients close: cleanups run last first
	return srv, snap, m, a, b
}

// placeGroup starts a group with system prompt sys at a and waits until b has learnt it (its first placement).
func placeGroup(t *testing.T, snap *policies.Snapshot, m *policies.Model, a, b replica, sys string) picker.Decision {
	t.Helper()
	d, err := a.picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "first")})
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the second replica hears the placement", func() bool {
		return testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("learnt")) == 1
	})
	return d
}

// publishedAtLeast waits (up to 10 s) until r has counted want messages published and returns its count: the
// other replica can hear a message before the publisher's goroutine has had Redis's reply and counted it.
func publishedAtLeast(r replica, want float64) float64 {
	count := func() float64 { return testutil.ToFloat64(r.bus.metrics.published) }
	wait.Until(10*time.Second, func() bool { return count() >= want })
	return count()
}

func prompt(t *testing.T, system, user string) *openai.Request {
	t.Helper()
	body := `{"model":"m","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + user + `"}]}`
	r, err := openai.ParseRequest(openai.EndpointChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

// Two gateway replicas on a real redis-server: a group one of them starts, the other sends to the same
// endpoint; an eviction one of them finds, the other forgets; neither learns its own messages, and what is not a
// placement is counted and dropped.
func TestReplicasShareOverRedis(t *testing.T) {
	srv, snap, m, a, b := twoReplicas(t)

	sys := strings.Repeat("You answer questions about the billing system only. ", 40)
	d := placeGroup(t, snap, m, a, b, sys)
	placed := d.Endpoints[0]
	for i := range 5 { // whatever each replica's index says, the group stays where it started
		d2, err := b.picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "more "+strings.Repeat("x", i))})
		if err != nil {
			t.Fatal(err)
		}
		if d2.Endpoints[0] != placed || d2.ExpectedCachedTokens == 0 {
			t.Fatalf("request %d at the second replica went to %s (expecting %d cached tokens), want %s", i, d2.Endpoints[0], d2.ExpectedCachedTokens, placed)
		}
		d = d2
	}
	if got := publishedAtLeast(a, 1); got != 1 {
		t.Errorf("the first replica published %v placements, want 1", got)
	}
	if got := testutil.ToFloat64(b.bus.metrics.published); got != 0 {
		t.Errorf("the second replica, following a held group, published %v placements, want 0", got)
	}
	wait.For(t, "each replica hears its own message back and skips it", func() bool {
		return testutil.ToFloat64(a.bus.metrics.received.WithLabelValues("own")) == 1
	})

	// The engine evicted the group: the second replica learns it from usage, the first from the bus.
	b.picker.Observe(d, openai.Usage{PromptTokens: 600, CachedTokens: 0, CachedReported: true})
	wait.For(t, "the first replica hears the eviction", func() bool {
		return testutil.ToFloat64(a.bus.metrics.received.WithLabelValues("forgotten")) == 1
	})
	d3, err := a.picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "after the eviction")})
	if err != nil {
		t.Fatal(err)
	}
	if d3.ExpectedCachedTokens != 0 {
		t.Errorf("after the eviction the first replica still expects %d cached tokens", d3.ExpectedCachedTokens)
	}

	// Another publisher's garbage and an endpoint the policy does not list.
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = raw.Close() }()
	ctx := t.Context()
	if err := raw.Publish(ctx, Channel, "not a placement").Err(); err != nil {
		t.Fatal(err)
	}
	stranger := Encode(Origin{9}, picker.Placement{Endpoint: "192.0.2.1:80", Hashes: []uint64{1, 2, 3}})
	if err := raw.Publish(ctx, Channel, stranger).Err(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "malformed and unknown messages counted", func() bool {
		return testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("malformed")) == 1 &&
			testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("unknown_endpoint")) == 1
	})
	if b.picker.Index.Capacity("192.0.2.1:80") != 0 {
		t.Error("a placement on an endpoint outside the policy was indexed")
	}
}

// Publish never blocks the request path: with Redis unreachable and the queue full, placements are dropped and
// counted.
func TestPublishNeverBlocks(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer func() { _ = client.Close() }()
	b := New(Options{Client: client, Queue: 2})
	for range 5 {
		b.Publish(picker.Placement{Endpoint: "e:1", Hashes: []uint64{1}})
	}
	if got := testutil.ToFloat64(b.metrics.dropped.WithLabelValues("queue_full")); got != 3 {
		t.Errorf("dropped %v placements for a full queue of 2 after 5, want 3", got)
	}
}

// On a real Redis Cluster (three masters, a replica each) a placement published through one node reaches a
// replica subscribed through another: classic pub/sub is broadcast to the whole cluster.
func TestReplicasShareOverARealCluster(t *testing.T) {
	cluster := redistest.StartRealCluster(t, 3)
	snap, m := testSnap(t)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var reps []replica
	for i := range 2 { // each through another node
		addrs := cluster.Addrs()
		reps = append(reps, startReplicaOn(t, ctx, redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addrs[i%len(addrs)]}}), snap, &wg))
	}
	sys := strings.Repeat("You answer questions about shipping only. ", 40)
	d, err := reps[0].picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "first")})
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the placement to cross the cluster", func() bool {
		return testutil.ToFloat64(reps[1].bus.metrics.received.WithLabelValues("learnt")) == 1
	})
	d2, err := reps[1].picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "second")})
	if err != nil {
		t.Fatal(err)
	}
	if d2.Endpoints[0] != d.Endpoints[0] {
		t.Errorf("the second replica chose %s, the first placed the group on %s", d2.Endpoints[0], d.Endpoints[0])
	}
}

// A churn report crosses Redis as one message for all its endpoints, and ages the receiver's index: after as
// many unmatched blocks as the index holds, the group it learnt is gone, as the engine's cache would have lost it.
func TestChurnOverRedis(t *testing.T) {
	_, snap, m, a, b := twoReplicas(t)
	sys := strings.Repeat("You answer questions about returns only. ", 40)
	ep := placeGroup(t, snap, m, a, b, sys).Endpoints[0]
	capacity := b.picker.Index.Capacity(ep)
	other := "10.0.0.4:1"
	if other == ep {
		other = "10.0.0.3:1"
	}
	a.bus.PublishChurn(map[string]int{ep: capacity, other: 3, "192.0.2.9:1": 5})
	if !wait.Until(10*time.Second, func() bool {
		return testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("churn")) == 2 &&
			testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("unknown_endpoint")) == 1
	}) {
		t.Fatalf("heard %v churn entries and %v for unknown endpoints, want 2 and 1",
			testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("churn")),
			testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("unknown_endpoint")))
	}
	if got := publishedAtLeast(a, 2); got != 2 {
		t.Errorf("published %v messages (a placement, then one churn report for three endpoints), want 2", got)
	}
	d2, err := b.picker.Pick(snap, picker.Input{Model: m, Request: prompt(t, sys, "second")})
	if err != nil {
		t.Fatal(err)
	}
	if d2.ExpectedCachedTokens != 0 {
		t.Errorf("after %d blocks of churn on %s the second replica still expects %d cached tokens there", capacity, ep, d2.ExpectedCachedTokens)
	}
}

// sloPolicy is the test policy under SLO placement, for the long prompts replicas tell each other of.
var sloPolicy = strings.NewReplacer("spec:\n", "spec:\n  routing: {placement: slo, debugScores: true}\n  tiers: {pro: {slo: {ttft: 1s}}}\n",
	"engine: vllm,", "engine: vllm, maxConcurrency: 16,", "{name: t, ", "{name: t, tier: pro, ").Replace(policy)

// A long prompt one replica sends reaches the other over Redis as its own kind of message, counted as such, and
// the other predicts a request sent behind it there to wait for its prefill until it hears it done; one to an
// endpoint the policy does not list is not learnt.
func TestLongPromptsOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	snap, err := policies.Parse("p.yaml", []byte(sloPolicy))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	a, b := startReplica(t, ctx, srv.Addr, snap, &wg), startReplica(t, ctx, srv.Addr, snap, &wg)
	t.Cleanup(func() { cancel(); wg.Wait() })
	ttfts := func() map[string]time.Duration {
		t.Helper()
		d, err := b.picker.Pick(snap, picker.Input{Tenant: tenant, Model: m, Request: prompt(t, "sys", "short")})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Duration{}
		for _, s := range d.Scores {
			out[s.Endpoint] = s.TTFT
		}
		return out
	}
	// b predicts for every endpoint: it has a model to count the long prompt in.
	before := ttfts()
	long := strings.Repeat("A long document the model must read before it answers. ", 800) // ≈ 11K tokens
	d, err := a.picker.Pick(snap, picker.Input{Tenant: tenant, Model: m, Request: prompt(t, long, "?")})
	if err != nil {
		t.Fatal(err)
	}
	ep := d.Endpoints[0]
	a.bus.Publish(picker.Placement{Endpoint: "192.0.2.9:1", Prefill: 30000, Due: 2 * time.Second, ID: 2})
	heard := func(result string) float64 { return testutil.ToFloat64(b.bus.metrics.received.WithLabelValues(result)) }
	if !wait.Until(10*time.Second, func() bool { return heard("prefill") == 1 && heard("unknown_endpoint") == 1 }) {
		t.Fatalf("heard %v long prompts and %v for unknown endpoints, want 1 and 1", heard("prefill"), heard("unknown_endpoint"))
	}
	if heard("malformed") != 0 {
		t.Errorf("%v long prompts counted malformed", heard("malformed"))
	}
	// About 11,000 tokens at 7,000 a second.
	if after := ttfts()[ep]; after-before[ep] < 1200*time.Millisecond {
		t.Errorf("predicted TTFT at %s %v before the other replica's long prompt, %v after; want about 1.6 s more", ep, before[ep], after)
	}
	// Its first token passes at a: b hears it done and releases it.
	a.picker.Prefilled(d)
	if !wait.Until(10*time.Second, func() bool { return heard("prefill_done") == 1 }) {
		t.Fatal("the other replica never heard the long prompt done")
	}
	if after := ttfts()[ep]; after-before[ep] > 300*time.Millisecond {
		t.Errorf("predicted TTFT at %s %v before the other replica's long prompt, %v once it was done", ep, before[ep], after)
	}
}

// With a message key, only what a replica sealed with it is learnt: a placement any Redis client publishes
// (unsigned, sealed with another key, or a sealed one replayed after MaxMessageAge) is dropped and counted,
// and the conversation stays where it is.
func TestForgedPlacementsAreDropped(t *testing.T) {
	srv := redistest.Start(t)
	snap, m := testSnap(t)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	key := []byte("the replicas' shared message key, 32+ bytes")
	clock := &testClock{now: time.Unix(1_800_000_000, 0)}
	sealer, err := pubsub.NewSealer(key, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	start := func() replica {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = client.Close() })
		r := replica{picker: picker.NewAffinity(&fleet.InFlight{}, nil), reg: prometheus.NewRegistry()}
		r.picker.PolicyChanged(snap)
		r.bus = New(Options{Client: client, Metrics: NewMetrics(r.reg), Sealer: sealer})
		r.picker.Placements = r.bus
		r.picker.ChurnEvery = -1
		wg.Go(func() { r.bus.Run(ctx, r.picker.Learn) })
		<-r.bus.Ready()
		return r
	}
	a, b := start(), start()
	t.Cleanup(func() { cancel(); wg.Wait() })
	d := placeGroup(t, snap, m, a, b, strings.Repeat("a long shared system prompt ", 40)) // sealed: learnt
	req := prompt(t, strings.Repeat("a long shared system prompt ", 40), "second")
	hashes := picker.Hasher{BlockBytes: 64, MaxBlocks: 256}.Hash(nil, picker.Seed("m", ""), req.Prompt)
	other := "10.0.0.4:1"
	if d.Endpoints[0] == other {
		other = "10.0.0.3:1"
	}
	forged := Encode(Origin{1}, picker.Placement{Endpoint: other, Capacity: 1 << 20, Hashes: hashes})
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	otherKey, _ := pubsub.NewSealer([]byte("an attacker's key, thirty-two bytes long!!"), clock.Now)
	stale := sealer.Seal(Channel, forged)
	clock.Advance(pubsub.MaxMessageAge + time.Second)
	for _, msg := range [][]byte{forged, otherKey.Seal(Channel, forged), stale} {
		if err := raw.Publish(ctx, Channel, msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	dropped := func() float64 {
		n := 0.0
		for _, r := range []string{"unsigned", "forged", "stale"} {
			n += testutil.ToFloat64(b.bus.metrics.received.WithLabelValues(r))
		}
		return n
	}
	wait.For(t, "the three forged messages dropped", func() bool { return dropped() == 3 })
	if learnt := testutil.ToFloat64(b.bus.metrics.received.WithLabelValues("learnt")); learnt != 1 {
		t.Errorf("%v placements learnt, want only the sealed one", learnt)
	}
	got, err := b.picker.Pick(snap, picker.Input{Model: m, Request: req})
	if err != nil {
		t.Fatal(err)
	}
	if got.Endpoints[0] != d.Endpoints[0] {
		t.Errorf("the conversation moved from %s to %s on forged messages", d.Endpoints[0], got.Endpoints[0])
	}
}

// testClock is a clock tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }
