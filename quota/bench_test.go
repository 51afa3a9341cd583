package quota

import (
	"context"
	"testing"

	"github.com/infergate/infergate/test/redistest"
)

// BenchmarkAdmitSettle is one admission and one settlement against a real redis-server on loopback, the
// work quotas add to a request (five limits checked). go test ./quota -run '^$' -bench Admit
func BenchmarkAdmitSettle(b *testing.B) {
	srv := redistest.Start(b)
	snap, tn, m := policy(b, "requestsPerSecond: 1000000000, tokensPerMinute: 1000000000000, maxConcurrent: 1000000, monthlySpendUSD: 1000000000", "redisTimeout: 1s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := New(ctx, Options{Addrs: []string{srv.Addr}})
	r := req(snap, tn, m, 100)
	b.ReportAllocs()
	start := l.RoundTrips()
	for b.Loop() {
		tk, rej, err := l.Admit(context.Background(), r)
		if err != nil || rej != nil {
			b.Fatal(rej, err)
		}
		l.Settle(tk, 80, 80)
	}
	b.ReportMetric(float64(l.RoundTrips()-start)/float64(b.N), "roundtrips/op")
}
