package quota

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// clusterPolicy has n tenants (keys sk-cluster-<i>), each with the quota given.
func clusterPolicy(t *testing.T, n int, quota, settings string) (*policies.Snapshot, []*policies.Tenant, *policies.Model) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - {name: tenant%d, apiKeys: [%q], models: [\"*\"], quota: {%s}}\n", i, policies.HashKey(fmt.Sprint("sk-cluster-", i)), quota)
	}
	snap, err := policies.Parse("p.yaml", []byte(policyHead(settings)+b.String()))
	if err != nil {
		t.Fatal(err)
	}
	var tenants []*policies.Tenant
	for i := range n {
		tn, _ := snap.TenantForKey(fmt.Sprint("sk-cluster-", i))
		tenants = append(tenants, tn)
	}
	m, _ := snap.Model("m")
	return snap, tenants, m
}

func clusterLimiter(t *testing.T, c *redistest.RealCluster, now func() time.Time) *Limiter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return New(ctx, Options{Addrs: c.Addrs(), Cluster: true, Now: now, RenewInterval: -1})
}

// On a real cluster of three masters (and their replicas), tenants spread over the masters, and each
// tenant's scripts run in its own slot on whichever master owns it.
func TestRealClusterSpreadsTenants(t *testing.T) {
	c := redistest.StartRealCluster(t, 3)
	snap, tenants, m := clusterPolicy(t, 24, "requestsPerSecond: 5, tokensPerMinute: 1000, maxConcurrent: 2", "leaseFraction: 0")
	l := clusterLimiter(t, c, nil)
	masters := map[string]int{}
	for _, tn := range tenants {
		tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
		if err != nil || rej != nil {
			t.Fatalf("%s: %+v %v", tn.Name, rej, err)
		}
		l.Settle(tk, 100, 100)
		masters[c.MasterOf(concKey(tn)).Addr]++
	}
	if len(masters) != 3 {
		t.Errorf("24 tenants on %d masters: %v", len(masters), masters)
	}
}

// A master dies under load: its replica takes over within a couple of seconds; meanwhile the fail-open mode
// admits under the local limiter (no request errors), and once Redis answers again the tenant's window,
// admissions replayed, is never overshot by more than 1 %. Every request uses 40 of the 100 tokens it
// reserved, so refunds cross the failover too (settled before it, held through it, or after it). With leases
// the gateway asks Redis far less than once per admitted request.
func TestRealClusterMasterFailover(t *testing.T) {
	c := redistest.StartRealCluster(t, 3)
	const limit = 200_000 // tokens per minute
	snap, tenants, m := clusterPolicy(t, 1, fmt.Sprintf("tokensPerMinute: %d", limit), "failMode: open, redisTimeout: 200ms")
	tn := tenants[0]
	fixed := time.Date(2026, 12, 1, 10, 0, 5, 0, time.UTC) // one window throughout
	l := clusterLimiter(t, c, func() time.Time { return fixed })
	var admitted, attempts, errs atomic.Int64
	var stop, paused atomic.Bool
	var inFlight atomic.Int64 // admissions under way, waited for while the load pauses
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				inFlight.Add(1) // before looking at paused: the pause then sees this admission or stops it
				if paused.Load() {
					inFlight.Add(-1)
					runtime.Gosched()
					continue
				}
				attempts.Add(1)
				tk, rej, err := l.Admit(context.Background(), req(snap, tn, m, 100))
				switch {
				case err != nil:
					errs.Add(1)
				case rej == nil:
					admitted.Add(40)
					l.Settle(tk, 40, 0)
				}
				inFlight.Add(-1)
			}
		}()
	}
	wait.For(t, "load on the cluster", func() bool { return admitted.Load() >= limit/4 })
	master := c.MasterOf(concKey(tn))
	// The load pauses while the replica acknowledges what the master has: what Redis acknowledged then
	// survives the failover (asynchronous replication on a busy machine lost whole windows, which is Redis's
	// failing, not the limiter's); the load resumes as the master dies.
	paused.Store(true)
	wait.For(t, "the admissions under way", func() bool { return inFlight.Load() == 0 })
	c.WaitCaughtUp(master)
	master.Kill()
	paused.Store(false)
	wait.Within(t, "the limiter to notice", 30*time.Second, func() bool { return !l.Up() })
	c.WaitHealthy() // the replica promoted
	wait.Within(t, "the limiter back on Redis", 30*time.Second, l.Up)
	// Filled: another request's 100 reserved tokens no longer fit once the refunds are in.
	wait.Within(t, "the window filled", 60*time.Second, func() bool { return admitted.Load() > limit-200 })
	// Past the limit: keep trying a while, then see what was admitted in all. Each attempt past an exhausted
	// limit asks Redis (no lease holds credit for it), so the round trips per admission are counted up to here.
	before, admittingTrips, admittedBefore := attempts.Load(), l.RoundTrips(), admitted.Load()
	wait.Within(t, "attempts beyond the limit", 30*time.Second, func() bool { return attempts.Load() > before+2000 })
	stop.Store(true)
	wg.Wait()
	if errs.Load() != 0 {
		t.Errorf("%d admissions failed: the open fail mode must answer through the failover", errs.Load())
	}
	if got := admitted.Load(); got > limit*101/100 {
		t.Errorf("admitted %d tokens against %d per minute: overshoot %.2f%%", got, limit, 100*float64(got-limit)/limit)
	}
	perRequest := float64(admittingTrips) / float64(admittedBefore/100)
	t.Logf("admitted %d of %d tokens over %d attempts; %d Redis round trips while admitting, %.3f per admitted request; %d for the %d attempts past the limit",
		admitted.Load(), limit, attempts.Load(), admittingTrips, perRequest, l.RoundTrips()-admittingTrips, attempts.Load()-before)
	if perRequest > 0.5 {
		t.Errorf("%.2f Redis round trips per admission: leases should keep most requests off Redis", perRequest)
	}
}
