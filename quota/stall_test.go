package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// A stall that every admission in flight meets (Redis paused past redisTimeout, as an fsync or a busy CPU
// stalls it) fails them together: they meet the fail mode, but count as one failure, so Redis is not marked
// down and the next requests go to it as before. Failures of admissions started one after another still mark
// it down.
func TestOneStallIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "tokensPerMinute: 100000", "failMode: closed, redisTimeout: 100ms, leaseFraction: 0")
	l := newLimiter(t, srv.Addr, false, &clock{now: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)})
	if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 10)); err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	srv.Pause()
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := l.Admit(context.Background(), req(snap, tn, m, 10)); errors.Is(err, ErrUnavailable) {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if refused != 8 {
		t.Fatalf("%d of 8 refused during the stall, want all (fail closed)", refused)
	}
	if !l.Up() {
		t.Fatal("one stall of 8 concurrent admissions marked Redis down")
	}
	for range downAfterFailures { // admissions one after another, each failing: an outage
		_, _, _ = l.Admit(context.Background(), req(snap, tn, m, 10))
	}
	if l.Up() {
		t.Fatal("consecutive failures did not mark Redis down")
	}
	srv.Resume()
}

// A gateway that fails open goes on from what Redis last counted in the window, not from its own admissions
// alone: a restarted gateway (or one whose tenant's other replicas used the window) does not grant the window
// again during an outage.
func TestFailOpenStartsFromRedisCount(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "tokensPerMinute: 1000", "failMode: open, redisTimeout: 100ms, leaseFraction: 0")
	c := &clock{now: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)}
	before := newLimiter(t, srv.Addr, false, c) // the gateway before its restart: 900 of 1000 used
	if _, rej, err := before.Admit(context.Background(), req(snap, tn, m, 900)); err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	l := newLimiter(t, srv.Addr, false, c) // after the restart, it admits through Redis once
	if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 50)); err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	srv.Kill()
	for range downAfterFailures {
		_, _, _ = l.Admit(context.Background(), req(snap, tn, m, 0))
	}
	if l.Up() {
		t.Fatal("still up")
	}
	if tk, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 100)); rej == nil {
		t.Fatalf("admitted 100 locally (ticket %+v) with 950 of 1000 counted in Redis", tk)
	}
	if _, rej, _ := l.Admit(context.Background(), req(snap, tn, m, 40)); rej != nil {
		t.Errorf("40 more refused: %+v; 950 + 40 is within the limit", rej)
	}
}

// A settlement given up while Redis did not answer (it failed maxSettleAttempts times before the limiter
// marked Redis down) keeps freeing its concurrency slots until they would have expired anyway: the finished
// request's slot is freed once Redis answers, instead of staying taken and refusing the tenant's next requests.
// Its refund is dropped and counted: applied late it could answer for a write Redis lost.
func TestGivenUpSettlementStillFreesItsSlot(t *testing.T) {
	srv := redistest.StartPersistent(t)
	snap, tn, m := policy(t, "maxConcurrent: 1, tokensPerMinute: 1000", "failMode: open, redisTimeout: 200ms, leaseFraction: 0")
	l := newLimiter(t, srv.Addr, false, &clock{now: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)})
	tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
	if err != nil || rej != nil {
		t.Fatal(rej, err)
	}
	srv.Kill()
	l.Settle(tk, 10, 10)
	wait.Within(t, "the settlement given up", 30*time.Second, func() bool { return l.redis.dropped.Load() == 1 })
	srv.Restart() // the append-only file brings the slot back
	wait.Within(t, "the slot freed once Redis answers", 30*time.Second, func() bool {
		n, _ := srv.Do("ZCARD", concKey(tn))
		return n == "0"
	})
}
