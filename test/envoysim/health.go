package envoysim

// This file emulates Envoy's active HTTP health checking of cluster hosts: a probe per host every interval
// (no_traffic_interval while the cluster carries no traffic, Envoy's default 60 s), a host failing
// unhealthy_threshold probes in a row leaves the rotation until healthy_threshold succeed, and a successful
// probe of a host outlier detection ejected brings it back at once (outlier_detection
// .successful_active_health_check_uneject_host, default true).

import (
	"context"
	"net/http"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// HealthCheck is a cluster's active HTTP health check, or its gRPC one (grpc.health.v1, the processor's
// cluster only: processor.go).
type HealthCheck struct {
	GRPC                      bool
	GRPCService               string
	Path                      string
	Interval, NoTraffic       time.Duration
	Timeout                   time.Duration
	Unhealthy, Healthy        int
	ExpectedLow, ExpectedHigh int // [low, high): default 200 only
	UnejectOnSuccess          bool
}

// parseHealthCheck reads the first HTTP or gRPC health check of a cluster, or nil.
func parseHealthCheck(hcs []*corev3.HealthCheck, unejectOnSuccess bool) *HealthCheck {
	for _, hc := range hcs {
		http, grpcHC := hc.GetHttpHealthCheck(), hc.GetGrpcHealthCheck()
		if http == nil && grpcHC == nil {
			continue
		}
		out := &HealthCheck{GRPC: grpcHC != nil, GRPCService: grpcHC.GetServiceName(), Path: http.GetPath(), Interval: hc.GetInterval().AsDuration(), Timeout: hc.GetTimeout().AsDuration(),
			NoTraffic: 60 * time.Second, Unhealthy: int(hc.GetUnhealthyThreshold().GetValue()),
			Healthy: int(hc.GetHealthyThreshold().GetValue()), ExpectedLow: 200, ExpectedHigh: 201, UnejectOnSuccess: unejectOnSuccess}
		if d := hc.GetNoTrafficInterval(); d != nil {
			out.NoTraffic = d.AsDuration()
		}
		if r := http.GetExpectedStatuses(); len(r) > 0 {
			out.ExpectedLow, out.ExpectedHigh = int(r[0].GetStart()), int(r[0].GetEnd())
		}
		out.Unhealthy, out.Healthy = max(1, out.Unhealthy), max(1, out.Healthy)
		if out.Interval <= 0 {
			out.Interval = time.Second
		}
		return out
	}
	return nil
}

// healthState is what active health checking knows of every host, by cluster and host.
type healthState struct {
	mu      sync.Mutex
	failing map[string]bool // out of rotation after unhealthy_threshold failures
	streak  map[string]int  // consecutive results of the current kind (failures while healthy, passes while failing)
	traffic map[string]bool // the cluster carried a request since its last round
}

func newHealthState() *healthState {
	return &healthState{failing: map[string]bool{}, streak: map[string]int{}, traffic: map[string]bool{}}
}

func (h *healthState) failed(cluster, host string) bool {
	if h == nil { // a data plane built without health checking (unit tests)
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failing[hostKey(cluster, host)]
}

func (h *healthState) sawTraffic(cluster string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.traffic[cluster] = true
	h.mu.Unlock()
}

// record applies one probe result and reports whether the host passed.
func (h *healthState) record(c *Cluster, host string, pass bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := hostKey(c.Name, host)
	if pass == !h.failing[k] { // the result confirms the current state
		h.streak[k] = 0
		return
	}
	h.streak[k]++
	need := c.HealthCheck.Unhealthy
	if h.failing[k] {
		need = c.HealthCheck.Healthy
	}
	if h.streak[k] >= need {
		h.failing[k], h.streak[k] = !pass, 0
	}
}

// runHealthChecks probes every host of every cluster that has a health check, until ctx ends. The first
// round runs before it returns (Envoy warms a cluster until its hosts were checked once); later rounds run
// in the background.
func (dp *DataPlane) runHealthChecks(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range dp.cfg.Clusters {
		if c.HealthCheck == nil {
			continue
		}
		dp.probeRound(ctx, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next := c.HealthCheck.Interval
				dp.health.mu.Lock()
				if !dp.health.traffic[c.Name] {
					next = c.HealthCheck.NoTraffic
				}
				dp.health.traffic[c.Name] = false
				dp.health.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-time.After(next):
				}
				dp.probeRound(ctx, c)
			}
		}()
	}
	go func() { <-ctx.Done(); wg.Wait() }()
}

// probeRound checks each host of a cluster once, in parallel.
func (dp *DataPlane) probeRound(ctx context.Context, c *Cluster) {
	var wg sync.WaitGroup
	for _, host := range c.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pass := dp.probe(ctx, c, host)
			dp.health.record(c, host, pass)
			if pass && c.HealthCheck.UnejectOnSuccess {
				dp.outliers.uneject(c.Name, host)
			}
		}()
	}
	wg.Wait()
}

func (dp *DataPlane) probe(ctx context.Context, c *Cluster, host string) bool {
	timeout := c.HealthCheck.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if c.HealthCheck.GRPC {
		if dp.procs == nil || c.Name != dp.procs.cluster {
			return false // gRPC health checking is emulated for the processor's cluster only
		}
		return dp.probeProcessor(pctx, c.HealthCheck, host)
	}
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, "http://"+host+c.HealthCheck.Path, nil)
	if err != nil {
		return false
	}
	req.Header.Set("user-agent", "Envoy/HC")
	resp, err := dp.transport.RoundTrip(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= c.HealthCheck.ExpectedLow && resp.StatusCode < c.HealthCheck.ExpectedHigh
}
