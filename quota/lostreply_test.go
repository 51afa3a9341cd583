package quota

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// loseAdmission makes the next admission's pipeline fail as a timeout does on a busy machine: after Redis
// ran it (ran) or before it was sent.
type loseAdmission struct {
	armed *atomic.Bool
	ran   bool
}

func (h loseAdmission) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h loseAdmission) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h loseAdmission) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.armed.Load() || !admits(cmds) {
			return next(ctx, cmds)
		}
		h.armed.Store(false)
		if h.ran {
			_ = next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(context.DeadlineExceeded)
		}
		return context.DeadlineExceeded
	}
}

func admits(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if a := c.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == admitScript.Hash() {
			return true
		}
	}
	return false
}

// An admission whose reply is lost may or may not have run in Redis; its marker says which, so the request is
// counted there once at its real use whichever it was — across an outage, without one, and when it is refused
// under fail-closed. (Before, a lost reply after the script ran kept the reservation and, after an outage,
// added the real use on top: 601 tokens for 101 used.)
func TestLostAdmissionReplyIsResolvedExactly(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ran, outage bool
		failMode    string
		settle      bool
		want        string
	}{
		{"ran, then an outage", true, true, "open", true, "101"},
		{"never ran, then an outage", false, true, "open", true, "101"},
		{"ran, no outage", true, false, "open", true, "101"},
		{"never ran, no outage", false, false, "open", true, "101"},
		{"ran, refused as fail-closed", true, false, "closed", false, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartPersistent(t)
			snap, tn, m := policy(t, "maxConcurrent: 2, tokensPerMinute: 1000",
				"failMode: "+tc.failMode+", redisTimeout: 200ms, leaseFraction: 0")
			c := &clock{now: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)}
			l := newLimiter(t, srv.Addr, false, c)
			warm, _, err := l.Admit(context.Background(), req(snap, tn, m, 1)) // loads the scripts
			if err != nil || warm == nil {
				t.Fatal(err)
			}
			l.Settle(warm, 1, 1)
			l.redis.flushPending(context.Background(), time.Second)
			var armed atomic.Bool
			armed.Store(true)
			l.redis.client.AddHook(loseAdmission{&armed, tc.ran})
			tk, _, err := l.Admit(context.Background(), req(snap, tn, m, 500))
			switch {
			case tc.failMode == "closed":
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("fail-closed admission: %v, want ErrUnavailable", err)
				}
			case err != nil || tk == nil || !tk.local || !tk.ambiguous:
				t.Fatalf("admission: %+v %v, want a local ticket whose admission may have run", tk, err)
			}
			key := ""
			for _, e := range warm.entries {
				if e.kind == KindTokens {
					key = e.key
				}
			}
			if tc.outage {
				srv.Kill()
				for range downAfterFailures {
					_, _, _ = l.Admit(context.Background(), req(snap, tn, m, 0))
				}
			}
			if tc.settle {
				l.Settle(tk, 100, 100)
			}
			if tc.outage {
				srv.Restart()
				wait.For(t, "recovery", l.Up)
			}
			l.redis.flushPending(context.Background(), time.Second)
			if v, _ := srv.Do("GET", key); v != tc.want {
				t.Errorf("tokens counter %q, want %s: the warm-up's 1 and the request's real use, once", v, tc.want)
			}
			if n, _ := srv.Do("ZCARD", concKey(tn)); n != "0" {
				t.Errorf("%s concurrency slots held, want none", n)
			}
			if n, _ := srv.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "*admitted*"); n != "0" {
				t.Errorf("%s admission markers left, want every one resolved or settled", n)
			}
		})
	}
}

// With leases, a lost admission may also have granted top-ups no lease received: its marker holds them, and
// the counter ends where it ends when the script never ran.
func TestLostAdmissionReplyWithLeases(t *testing.T) {
	final := map[bool]string{}
	for _, ran := range []bool{true, false} {
		srv := redistest.Start(t)
		snap, tn, m := policy(t, "tokensPerMinute: 100000", "failMode: open, redisTimeout: 200ms, leaseFraction: 0.05")
		c := &clock{now: time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)}
		l := newLimiter(t, srv.Addr, false, c)
		if err := l.redis.loadScripts(context.Background()); err != nil {
			t.Fatal(err)
		}
		var armed atomic.Bool
		armed.Store(true)
		l.redis.client.AddHook(loseAdmission{&armed, ran})
		// The first admission asks Redis for a lease top-up besides its own tokens.
		tk, _, err := l.Admit(context.Background(), req(snap, tn, m, 2000))
		if err != nil || tk == nil || !tk.ambiguous {
			t.Fatalf("ran=%v: admission %+v %v, want a local ticket whose admission may have run", ran, tk, err)
		}
		if ran {
			if v, _ := srv.Do("GET", tk.entries[0].key); v == "2000" || v == "" {
				t.Fatalf("the lost admission reserved %q: no top-up was granted, so the test would check nothing", v)
			}
		}
		l.Settle(tk, 300, 300)
		l.redis.flushPending(context.Background(), time.Second)
		final[ran], _ = srv.Do("GET", tk.entries[0].key)
		if n, _ := srv.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "*admitted*"); n != "0" {
			t.Errorf("ran=%v: %s admission markers left", ran, n)
		}
	}
	if final[true] != final[false] || final[true] != "300" {
		t.Errorf("tokens counter %q when the lost admission ran, %q when it did not: want the 300 used, both", final[true], final[false])
	}
}
