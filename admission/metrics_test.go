package admission

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/policies"
)

// The queue's series follow each request: in the gauges while it waits, then in the wait histogram and the
// results by how it ended.
func TestMetricsFollowTheQueue(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t)
	h.q = New(h.clock, NewMetrics(reg))
	ctx, cancel := context.WithCancel(context.Background())
	gold := policies.QueueClass{Tier: "gold", Priority: 1}
	h.enqueue(entry{name: "a", tenant: "x", class: gold, bytes: 300})
	h.enqueue(entry{name: "b", tenant: "x", class: gold, bytes: 200, ctx: ctx})
	m := h.q.Metrics()
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("m", "gold")); got != 2 {
		t.Errorf("queue requests %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.Bytes.WithLabelValues("m", "gold")); got != 500 {
		t.Errorf("queue bytes %v, want 500", got)
	}
	cancel()
	h.result("b")
	h.drain(1)
	h.result("a")
	m.Result("m", "gold", "shed", "expired") // what the director reports for a request it could not place
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("m", "gold")); got != 0 {
		t.Errorf("queue requests %v after both left", got)
	}
	if got := testutil.ToFloat64(m.Bytes.WithLabelValues("m", "gold")); got != 0 {
		t.Errorf("queue bytes %v after both left", got)
	}
	for _, c := range []struct{ result, reason string }{{"started", "room"}, {"aborted", "client"}, {"shed", "expired"}} {
		if got := testutil.ToFloat64(m.Results.WithLabelValues("m", "gold", c.result, c.reason)); got != 1 {
			t.Errorf("results{%s,%s} = %v, want 1", c.result, c.reason, got)
		}
	}
	if n := testutil.CollectAndCount(m.Wait); n != 2 {
		t.Errorf("%d wait series, want started and aborted", n)
	}
	for _, c := range []prometheus.Collector{m.Requests, m.Bytes, m.Wait, m.Results} {
		if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %v", problems, err)
		}
	}
	h.wg.Wait()
}
