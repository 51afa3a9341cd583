package quota

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

func TestLeaseSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		e        entry
		fraction float64
		replicas int
		want     int64
	}{
		{"rps slice", entry{kind: KindRequests, limit: 1000, amount: 1}, 0.05, 1, 50},
		{"split across replicas", entry{kind: KindRequests, limit: 1000, amount: 1}, 0.05, 4, 12},
		{"too small to cover two requests", entry{kind: KindRequests, limit: 20, amount: 1}, 0.05, 1, 0},
		{"tokens need room for two estimates", entry{kind: KindTokens, limit: 10000, amount: 300}, 0.05, 1, 0},
		{"tokens", entry{kind: KindTokens, limit: 100000, amount: 300}, 0.05, 1, 5000},
		{"concurrency capped", entry{kind: KindConcurrency, limit: 100000, amount: 1}, 0.05, 1, maxLeaseSlots},
		{"spend capped at 256 requests' cost", entry{kind: KindSpend, limit: 1e12, amount: 500}, 0.05, 1, 256 * 500},
		{"conversation never", entry{kind: KindConversation, limit: 1e9, amount: 1}, 0.05, 1, 0},
		{"disabled", entry{kind: KindRequests, limit: 1e9, amount: 1}, 0, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leaseSize(&tc.e, tc.fraction, tc.replicas); got != tc.want {
				t.Errorf("leaseSize = %d, want %d", got, tc.want)
			}
		})
	}
}

// Leases take Redis off the path: with them a request costs a small fraction of a round trip (0.08-0.18 beside
// two CPU hogs, where slower requests leave more to renew; at most a quarter), without them (leaseFraction: 0)
// about one.
func TestLeaseRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		settings string
		min, max float64
	}{
		{"leaseFraction: 0, redisTimeout: 5s", 0.8, 1.2},
		{"redisTimeout: 5s", 0, 0.25},
	} {
		t.Run(tc.settings, func(t *testing.T) {
			srv := redistest.Start(t)
			snap, tn, m := policy(t, "requestsPerSecond: 1000000, tokensPerMinute: 100000000, maxConcurrent: 1000", tc.settings)
			l := newLimiter(t, srv.Addr, false, &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)})
			const n = 2000
			start := l.RoundTrips()
			var wg sync.WaitGroup
			sem := make(chan struct{}, 32)
			for range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 10))
					if err != nil || rej != nil {
						t.Error(rej, err)
						return
					}
					l.Settle(tk, 5, 5)
				}()
			}
			wg.Wait()
			perRequest := float64(l.RoundTrips()-start) / n
			t.Logf("round trips per request: %.3f", perRequest)
			if perRequest < tc.min || perRequest > tc.max {
				t.Errorf("%.3f round trips per request, want %.2f..%.2f", perRequest, tc.min, tc.max)
			}
		})
	}
}

// Two gateways leasing from one Redis never admit more than the limit together, and hold back at most the
// lease fraction of it.
func TestLeasesNeverOvershootAcrossGateways(t *testing.T) {
	srv := redistest.Start(t)
	const limit, amount = 200000, 100
	snap, tn, m := policy(t, "tokensPerMinute: "+strconv.Itoa(limit), "gatewayReplicas: 2, leaseFraction: 0.1, redisTimeout: 5s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	gateways := []*Limiter{newLimiter(t, srv.Addr, false, c), newLimiter(t, srv.Addr, false, c)}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := gateways[i%2]
			for {
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, amount))
				if err != nil {
					t.Error(err)
					return
				}
				if rej != nil {
					if rej.Kind != KindTokens {
						t.Errorf("rejected by %s", rej.Kind)
					}
					return
				}
				admitted.Add(1)
				l.Settle(tk, amount, amount)
			}
		}()
	}
	wg.Wait()
	work := admitted.Load() * amount
	t.Logf("admitted %d tokens of %d", work, limit)
	if work > limit {
		t.Errorf("admitted %d tokens, over the limit of %d", work, limit)
	}
	if work < limit*9/10 {
		t.Errorf("admitted %d tokens, more than the lease fraction (10%%) of %d held back", work, limit)
	}
}

// Leases end up back in Redis: refunds of settled requests and idle credit are handed back, so the counters
// show exactly the real usage and the concurrency set empties — after leaseIdle, or at shutdown.
func TestLeasesHandedBack(t *testing.T) {
	for _, how := range []string{"idle", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t)
			snap, tn, m := policy(t, "tokensPerMinute: 1000000, maxConcurrent: 1000", "redisTimeout: 5s")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
			l := New(ctx, Options{Addrs: []string{srv.Addr}, Now: c.Now})
			now := c.Now()
			for range 10 {
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
				if err != nil || rej != nil {
					t.Fatal(rej, err)
				}
				l.Settle(tk, 40, 40)
			}
			key := "ig:" + tag(tn.Name) + ":tenant:tpm:" + windowID(now, time.Minute)
			if v, _ := srv.Do("GET", key); v == "400" {
				t.Fatalf("counter already at the real usage: no lease was taken")
			}
			if how == "shutdown" {
				cancel()
			} else {
				c.Advance(leaseIdle) // the sweeper, once a second, finds the leases idle
			}
			wait.For(t, "the lease handed back", func() bool {
				v, _ := srv.Do("GET", key)
				n, _ := srv.Do("ZCARD", concKey(tn))
				return v == "400" && n == "0"
			})
		})
	}
}

// A gateway that runs out of its slice still gets the rest of the limit from Redis, request by request.
func TestLeaseExhaustedFallsBackToRedis(t *testing.T) {
	srv := redistest.Start(t)
	snap, tn, m := policy(t, "requestsPerSecond: 100", "redisTimeout: 5s")
	c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	l := newLimiter(t, srv.Addr, false, c)
	admitted := 0
	for range 150 {
		if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1)); err != nil {
			t.Fatal(err)
		} else if rej == nil {
			admitted++
		}
	}
	if admitted != 100 {
		t.Errorf("admitted %d of 150 under 100 requests/s, want exactly 100 from one gateway", admitted)
	}
}

// A request Redis rejects while a top-up is on its way to this gateway's lease waits for that top-up (at most
// the Redis timeout): the top-up may hold the limit's last units, and rejecting without it admits fewer than
// the limit until the next request comes. Without an answer it is rejected once the timeout passes.
func TestRejectionAwaitsTopUpOnItsWay(t *testing.T) {
	for _, answered := range []bool{true, false} {
		t.Run(map[bool]string{true: "answered", false: "never answered"}[answered], func(t *testing.T) {
			srv := redistest.Start(t)
			snap, tn, m := policy(t, "requestsPerSecond: 100", "redisTimeout: 300ms")
			c := &clock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
			l := newLimiter(t, srv.Addr, false, c)
			for range 200 { // the window's limit used up, and the lease with it
				if _, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1)); err != nil {
					t.Fatal(err)
				} else if rej != nil {
					break
				}
			}
			key, lease := onlyLease(t, l)
			l.leases.mu.Lock()
			lease.asked = 1 // a top-up Redis counted and has not answered yet
			l.leases.mu.Unlock()

			done := make(chan *Rejection)
			start := time.Now()
			go func() {
				_, rej, err := l.Admit(context.Background(), req(snap, tn, m, 1))
				if err != nil {
					t.Error(err)
				}
				done <- rej
			}()
			wait.For(t, "the rejected request waiting for the top-up", func() bool {
				l.leases.mu.Lock()
				defer l.leases.mu.Unlock()
				return l.leases.answered != nil
			})
			if answered {
				topUp := []entry{{kind: KindRequests, key: key, covered: true, extra: 1}}
				l.leases.grant(c.Now(), tn.Name, "refill", topUp, []int64{1})
			}
			if rej := <-done; (rej == nil) != answered {
				t.Fatalf("rejection %v, want admitted only when the top-up is answered", rej)
			}
			if waited := time.Since(start); !answered && waited < 300*time.Millisecond {
				t.Errorf("rejected after %v, before the Redis timeout (300ms) a top-up on its way had to answer in", waited)
			}
		})
	}
}

// onlyLease is the limiter's one lease and its key.
func onlyLease(t *testing.T, l *Limiter) (string, *lease) {
	t.Helper()
	l.leases.mu.Lock()
	defer l.leases.mu.Unlock()
	if len(l.leases.byKey) != 1 {
		t.Fatalf("%d leases, want 1", len(l.leases.byKey))
	}
	for key, lease := range l.leases.byKey {
		return key, lease
	}
	return "", nil
}
