package envoysim

import (
	"math"
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
			if dp.attemptCluster(agg) == pool {
				toPool++
			}
		}
		if got := float64(toPool) / float64(n); math.Abs(got-tc.wantPool) > 0.02 {
			t.Errorf("%d of 4 unhealthy: %.3f of attempts to the pool, want %.2f", tc.unhealthy, got, tc.wantPool)
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
