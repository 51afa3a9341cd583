package quota

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// A master that has the admission script but not the settlement's (a master restarted or added, or the
// moment between loading the two) answers the settlements an admission carries NOSCRIPT while the admission
// itself runs. The admission loads the scripts, and the settlement, not counted as failed, is applied by the
// next one. Before, nothing loaded them while admissions carried every queued settlement, and after five
// admissions the settlement was dropped: a refund lost (the flaky resharding test's missing 40s).
func TestSettlementSurvivesAMissingScript(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	b := newRedisBackend(client) // no flusher: only admissions carry the settlement, as under steady traffic
	ctx := context.Background()
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := admitScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 1, 0, time.UTC)
	admit := func(id string, amount int64) {
		t.Helper()
		tk := &Ticket{ID: id, Tenant: "acme", entries: []entry{{kind: KindTokens, scope: "tenant", key: "k",
			limit: 1_000_000, amount: amount, window: time.Minute}}}
		if _, rej, err := b.admit(ctx, now, tk); err != nil || rej != nil {
			t.Fatalf("admission %s: %v %+v", id, err, rej)
		}
	}
	admit("first", 100)
	b.settleAsync("acme", "first", []settleItem{{key: "k", kind: KindTokens, delta: -40}})
	for i := range maxSettleAttempts + 1 {
		admit(fmt.Sprint("next", i), 1)
	}
	want := fmt.Sprint(100 - 40 + maxSettleAttempts + 1)
	if v, _ := srv.Do("GET", "k"); v != want {
		t.Errorf("counter %s after the settlement and %d admissions; want %s (the refund applied)", v, maxSettleAttempts+1, want)
	}
	if n := len(b.take(maxBatch)); n != 0 {
		t.Errorf("%d settlements still queued", n)
	}
}

// Only failures that pass by themselves leave a settlement's attempts alone.
func TestPassingFailures(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errors.New("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{errors.New("MOVED 3999 127.0.0.1:6381"), true},
		{errors.New("ASK 3999 127.0.0.1:6381"), true},
		{errors.New("NOSCRIPT No matching script. Please use EVAL."), true},
		{errors.New("CLUSTERDOWN The cluster is down"), true},
		{errors.New("LOADING Redis is loading the dataset in memory"), true},
		{errors.New("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		{errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{errors.New("ERR value is not an integer or out of range"), false},
		{context.DeadlineExceeded, false},
	} {
		if got := passing(tc.err); got != tc.want {
			t.Errorf("passing(%q) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A settlement an admission carried and that failed goes back in the queue; when no admission follows (the
// burst ended), the flusher sends it. Before, only a new settlement woke the flusher, and only when the queue
// had been empty: the refund and the freed slot waited for the next request.
func TestRequeuedSettlementIsFlushedWithoutTraffic(t *testing.T) {
	srv, client, b, ctx := backendOnRedis(t)
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := admitScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 2, 10, 0, 1, 0, time.UTC)
	tk := &Ticket{ID: "only", Tenant: "acme", entries: []entry{{kind: KindTokens, scope: "tenant", key: "k",
		limit: 1_000_000, amount: 100, window: time.Minute}}}
	if _, rej, err := b.admit(ctx, now, tk); err != nil || rej != nil {
		t.Fatal(err, rej)
	}
	b.settleAsync("acme", "earlier", []settleItem{{key: "k", kind: KindTokens, delta: -40}})
	<-b.flush // the flusher is not running yet: the settlement is left to the next admission
	last := &Ticket{ID: "last", Tenant: "acme", entries: []entry{{kind: KindTokens, scope: "tenant", key: "k",
		limit: 1_000_000, amount: 1, window: time.Minute}}}
	if _, rej, err := b.admit(ctx, now, last); err != nil || rej != nil { // carries it; it meets NOSCRIPT
		t.Fatal(err, rej)
	}
	if v, _ := srv.Do("GET", "k"); v != "101" {
		t.Fatalf("counter %s after the last admission; want 101 (the settlement it carried failed)", v)
	}
	go b.runFlusher(ctx, time.Second, func() {})
	wait.For(t, "the requeued refund", func() bool { v, _ := srv.Do("GET", "k"); return v == "61" })
}

// A settlement that keeps failing in a way that counts (here every attempt times out) is given up after
// maxSettleAttempts, and counted (infergate_quota_settlements_dropped_total): the refund it carried never
// reaches Redis.
func TestSettlementGivenUpIsCounted(t *testing.T) {
	_, _, b, ctx := backendOnRedis(t)
	b.settleAsync("acme", "doomed", []settleItem{{key: "k", kind: KindTokens, delta: -40}})
	go b.runFlusher(ctx, time.Nanosecond, func() {}) // no attempt can finish in time
	wait.For(t, "the settlement given up", func() bool { return b.dropped.Load() > 0 })
	b.mu.Lock()
	left := len(b.pending)
	b.mu.Unlock()
	if got := b.dropped.Load(); got != 1 || left != 0 {
		t.Fatalf("%d settlements dropped and %d still queued, want 1 and 0", got, left)
	}
}

// backendOnRedis is a Redis backend without a flusher on a real redis-server, and a context ending with the test.
func backendOnRedis(t *testing.T) (*redistest.Server, *redis.Client, *redisBackend, context.Context) {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return srv, client, newRedisBackend(client), ctx
}
