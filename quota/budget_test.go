package quota

import (
	"context"
	"testing"
	"time"

	"github.com/infergate/infergate/test/redistest"
)

// Each admission carries what is left of the tenant's request and token limits in the window, as Redis
// counted it — leases this gateway holds included — and when the window ends; the fail-open limiter reports
// its own count.
func TestAdmissionsCarryTheirBudget(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name, settings string
		// remaining requests after the first and second admission
		first, second int64
	}{
		{"every request asks Redis", "redisTimeout: 2s, leaseFraction: 0", 9, 8},
		// 20% of 10 requests is a 2-request lease taken at the first admission: Redis counts it at once.
		{"leases", "redisTimeout: 2s, leaseFraction: 0.2", 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, tn, m := policy(t, "requestsPerSecond: 10, tokensPerMinute: 1000", tc.settings)
			c := &clock{now: time.Date(2026, 12, 1, 10, 0, 0, 250_000_000, time.UTC)}
			_, _ = srv.Do("FLUSHALL")
			l := newLimiter(t, srv.Addr, false, c)
			var got []Budget
			for range 2 {
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
				if err != nil || rej != nil {
					t.Fatal(rej, err)
				}
				got = append(got, tk.Budgets()...)
			}
			if len(got) != 4 {
				t.Fatalf("budgets %+v, want requests and tokens twice", got)
			}
			req1, tok1, req2 := got[0], got[1], got[2]
			if req1.Kind != KindRequests || req1.Limit != 10 || req1.Remaining != tc.first || req2.Remaining != tc.second {
				t.Errorf("request budgets %+v then %+v, want %d then %d of 10", req1, req2, tc.first, tc.second)
			}
			if req1.Reset != 750*time.Millisecond {
				t.Errorf("requests reset in %v, want the rest of the second", req1.Reset)
			}
			if tok1.Kind != KindTokens || tok1.Limit != 1000 || tok1.Remaining > 900 || tok1.Reset != 59750*time.Millisecond {
				t.Errorf("token budget %+v, want at most 900 of 1000 left, reset with the minute", tok1)
			}
		})
	}
}
