package envoysim

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// An aggregate cluster sends to its first child while 1/1.4 of its hosts are available and spills the rest
// of the load to the next, as Envoy's priority load with the default overprovisioning factor does.
func TestAggregateSpillsByAvailability(t *testing.T) {
	pool := &Cluster{Name: "pool", Endpoints: []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"}}
	managed := &Cluster{Name: "managed", Endpoints: []string{"10.9.9.9:443"}}
	agg := &Cluster{Name: "agg", Children: []string{"pool", "managed"}}
	tests := []struct {
		unhealthy int
		wantPool  float64
	}{{0, 1}, {1, 1}, {2, 0.7}, {3, 0.35}, {4, 0}}
	for _, tc := range tests {
		pool.Unhealthy = map[string]bool{}
		for _, ep := range pool.Endpoints[:tc.unhealthy] {
			pool.Unhealthy[ep] = true
		}
		dp := &DataPlane{cfg: &Config{Clusters: map[string]*Cluster{"pool": pool, "managed": managed, "agg": agg}},
			outliers: &outliers{consecutive: map[string]int{}, ejectedTill: map[string]time.Time{}, ejections: map[string]int{}}}
		n, toPool := 20000, 0
		for range n {
			if dp.attemptCluster(agg, nil) == pool {
				toPool++
			}
		}
		if got := float64(toPool) / float64(n); math.Abs(got-tc.wantPool) > 0.02 {
			t.Errorf("%d of 4 unhealthy: %.3f of attempts to the pool, want %.2f", tc.unhealthy, got, tc.wantPool)
		}
	}
}

// The previous_priorities retry priority, as Envoy documents it: with update frequency N, after every N attempts
// the priorities attempted so far take no load; when none left has an available host, it starts over. With
// healths {100, 0, 50} and frequency 1 the attempts go P0, P2, P0, P2.
func TestPreviousPrioritiesExcludeAttemptedChildren(t *testing.T) {
	p0 := &Cluster{Name: "p0", Endpoints: []string{"10.0.0.1:1"}}
	p1 := &Cluster{Name: "p1", Endpoints: []string{"10.0.1.1:1"}, Unhealthy: map[string]bool{"10.0.1.1:1": true}}
	p2 := &Cluster{Name: "p2", Endpoints: []string{"10.0.2.1:1", "10.0.2.2:1"}, Unhealthy: map[string]bool{"10.0.2.2:1": true}}
	agg := &Cluster{Name: "agg", Children: []string{"p0", "p1", "p2"}}
	dp := &DataPlane{cfg: &Config{Clusters: map[string]*Cluster{"p0": p0, "p1": p1, "p2": p2, "agg": agg}},
		outliers: &outliers{consecutive: map[string]int{}, ejectedTill: map[string]time.Time{}, ejections: map[string]int{}}}
	for _, tc := range []struct {
		every int
		want  []*Cluster
	}{
		{1, []*Cluster{p0, p2, p0, p2}},
		{2, []*Cluster{p0, p0, p2, p2}},
		{0, []*Cluster{p0, p0, p0, p0}}, // no retry priority
	} {
		var rp *retryPriority
		if tc.every > 0 {
			rp = &retryPriority{every: tc.every}
		}
		for i, want := range tc.want {
			got := dp.attemptCluster(agg, rp)
			if got != want {
				t.Fatalf("update frequency %d, attempt %d: %s, want %s", tc.every, i+1, got.Name, want.Name)
			}
			rp.tried(got)
		}
	}
}

// Outlier detection ejects a host at consecutive_5xx failures, a success resets the count, and no more than
// max_ejection_percent of the cluster is ejected.
func TestOutlierEjection(t *testing.T) {
	c := &Cluster{Name: "pool", Endpoints: []string{"a:1", "b:1"}, Outlier: &clusterv3.OutlierDetection{
		Consecutive_5Xx: wrapperspb.UInt32(3), BaseEjectionTime: durationpb.New(time.Minute), MaxEjectionPercent: wrapperspb.UInt32(50)}}
	o := &outliers{consecutive: map[string]int{}, ejectedTill: map[string]time.Time{}, ejections: map[string]int{}}
	steps := []struct {
		host   string
		failed bool
		wantA  bool
		wantB  bool
	}{
		{"a:1", true, false, false}, {"a:1", true, false, false}, {"a:1", false, false, false}, // reset
		{"a:1", true, false, false}, {"a:1", true, false, false}, {"a:1", true, true, false}, // ejected
		{"b:1", true, true, false}, {"b:1", true, true, false}, {"b:1", true, true, false}, // 50 % cap
	}
	for i, s := range steps {
		o.result(c, s.host, s.failed)
		if a, b := o.ejected("pool", "a:1"), o.ejected("pool", "b:1"); a != s.wantA || b != s.wantB {
			t.Fatalf("step %d: ejected a=%v b=%v, want %v %v", i, a, b, s.wantA, s.wantB)
		}
	}
}

// Active health checking: a host that fails its probes leaves the rotation, and a successful probe brings an
// ejected host back at once instead of after the ejection time.
func TestActiveHealthCheckUnejects(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	c := &Cluster{Name: "pool", Endpoints: []string{host}, Outlier: &clusterv3.OutlierDetection{MaxEjectionPercent: wrapperspb.UInt32(100)},
		HealthCheck: &HealthCheck{Path: "/health", Interval: time.Hour, NoTraffic: time.Hour, Timeout: time.Second,
			Unhealthy: 2, Healthy: 1, ExpectedLow: 200, ExpectedHigh: 201, UnejectOnSuccess: true}}
	dp := &DataPlane{cfg: &Config{Clusters: map[string]*Cluster{"pool": c}}, health: newHealthState(), transport: &http.Transport{},
		outliers: &outliers{consecutive: map[string]int{}, ejectedTill: map[string]time.Time{}, ejections: map[string]int{}}}
	ctx := context.Background()
	for range 5 {
		dp.outliers.result(c, host, true)
	}
	if dp.available(c, host) {
		t.Fatal("five 5xx did not eject the host")
	}
	dp.probeRound(ctx, c)
	if !dp.available(c, host) {
		t.Error("a passing probe did not bring the ejected host back")
	}
	healthy.Store(false)
	dp.probeRound(ctx, c)
	if !dp.available(c, host) {
		t.Error("one failed probe took the host out (unhealthy_threshold 2)")
	}
	dp.probeRound(ctx, c)
	if dp.available(c, host) {
		t.Error("two failed probes left the host in rotation")
	}
	healthy.Store(true)
	dp.probeRound(ctx, c)
	if !dp.available(c, host) {
		t.Error("a passing probe (healthy_threshold 1) did not bring the host back")
	}
}
