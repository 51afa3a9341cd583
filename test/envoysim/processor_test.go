package envoysim

import (
	"context"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/contract"
)

// Envoy's priority load by hand: each priority takes min(what is left, 1.4 × its available share).
func TestPriorityLoads(t *testing.T) {
	for _, tc := range []struct {
		available, want []float64
		total           float64
	}{
		{[]float64{1, 1}, []float64{1, 0}, 1},
		{[]float64{0.75, 1}, []float64{1, 0}, 1},          // 1.4 × 0.75 ≥ 1: priority 0 keeps everything
		{[]float64{0.5, 1}, []float64{0.7, 0.3}, 1},       // spills 30 %
		{[]float64{0.5, 0.2}, []float64{0.7, 0.28}, 0.98}, // cannot take it all: the draw is normalised
		{[]float64{0, 0}, []float64{0, 0}, 0},             // none: the caller panics to priority 0
	} {
		loads := make([]float64, len(tc.available))
		total := priorityLoads(tc.available, loads)
		for i := range loads {
			if math.Abs(loads[i]-tc.want[i]) > 1e-9 {
				t.Errorf("%v: loads %v, want %v", tc.available, loads, tc.want)
			}
		}
		if math.Abs(total-tc.total) > 1e-9 {
			t.Errorf("%v: total %v, want %v", tc.available, total, tc.total)
		}
	}
}

// metaProcessor is a processor host that records the edge region each stream names and ends the stream.
type metaProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	mu      sync.Mutex
	regions []string
	health  *health.Server
}

func (m *metaProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	m.mu.Lock()
	m.regions = append(m.regions, fmt.Sprint(md.Get("x-edge-region")))
	m.mu.Unlock()
	return nil
}

func (m *metaProcessor) streams() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.regions...)
}

func startMetaProcessor(t *testing.T) (*metaProcessor, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &metaProcessor{health: health.NewServer()}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, m)
	healthpb.RegisterHealthServer(g, m.health)
	m.health.SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", healthpb.HealthCheckResponse_SERVING)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return m, lis.Addr().String()
}

// The processor's cluster fails over as Envoy's does: streams go to priority 0 while its host passes its gRPC
// health check, to priority 1 once it failed unhealthy_threshold checks, and back after healthy_threshold
// passes; every stream carries the grpc_service's initial_metadata.
func TestProcessorClusterFailsOverByPriority(t *testing.T) {
	local, localAddr := startMetaProcessor(t)
	remote, remoteAddr := startMetaProcessor(t)
	lh, lp, _ := net.SplitHostPort(localAddr)
	rh, rp, _ := net.SplitHostPort(remoteAddr)
	yaml := fmt.Sprintf(`
static_resources:
  listeners:
  - name: test
    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: test
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {cluster_name: proc}
                initial_metadata: [{key: x-edge-region, value: us-east}]
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config: {virtual_hosts: [{name: all, domains: ["*"], routes: [{match: {prefix: "/"}, direct_response: {status: 200}}]}]}
  clusters:
  - name: proc
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    health_checks:
    - {timeout: 1s, interval: 3600s, unhealthy_threshold: 2, healthy_threshold: 1, grpc_health_check: {service_name: envoy.service.ext_proc.v3.ExternalProcessor}}
    load_assignment:
      cluster_name: proc
      endpoints:
      - {priority: 0, lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}
      - {priority: 1, lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}
`, lh, lp, rh, rp)
	cfg, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	dp, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	ctx := context.Background()
	open := func(n int) {
		t.Helper()
		for range n {
			client, sctx := dp.processorClient(ctx, dp.initialMetadata())
			s, err := client.Process(sctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Recv(); err == nil {
				t.Fatal("the processor answered a stream it should have ended")
			}
		}
	}
	proc := cfg.Clusters["proc"]
	setLocal := func(st healthpb.HealthCheckResponse_ServingStatus) {
		local.health.SetServingStatus("envoy.service.ext_proc.v3.ExternalProcessor", st)
	}
	steps := []struct {
		name          string
		act           func()
		local, remote int // streams each has seen in all after the step's 10
	}{
		{"healthy: priority 0 takes every stream", func() { dp.probeRound(ctx, proc) }, 10, 0},
		{"one failed check is not enough (unhealthy_threshold 2)", func() {
			setLocal(healthpb.HealthCheckResponse_NOT_SERVING)
			dp.probeRound(ctx, proc)
		}, 20, 0},
		{"two failed checks: priority 1", func() { dp.probeRound(ctx, proc) }, 20, 10},
		{"one passing check brings priority 0 back (healthy_threshold 1)", func() {
			setLocal(healthpb.HealthCheckResponse_SERVING)
			dp.probeRound(ctx, proc)
		}, 30, 10},
	}
	for _, st := range steps {
		st.act()
		open(10)
		if l, r := len(local.streams()), len(remote.streams()); l != st.local || r != st.remote {
			t.Fatalf("%s: streams %d at priority 0 and %d at priority 1, want %d and %d", st.name, l, r, st.local, st.remote)
		}
	}
	for _, got := range append(local.streams(), remote.streams()...) {
		if got != "[us-east]" {
			t.Fatalf("a stream's edge region metadata was %s, want [us-east]", got)
		}
	}
}

// The shipped regions bootstrap lists the region's own gateway at priority 0 and two others after it,
// health-checked over gRPC, and names its region on every stream.
func TestShippedRegionsBootstrap(t *testing.T) {
	cfg, err := LoadFile("../../deploy/envoy/envoy-regions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Clusters[cfg.ExtProc.GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if c == nil || len(c.Endpoints) != 3 || c.Endpoints[0] != "127.0.0.1:9002" || fmt.Sprint(c.Priorities) != "[0 1 2]" {
		t.Fatalf("ext_proc cluster %+v", c)
	}
	if hc := c.HealthCheck; hc == nil || !hc.GRPC || hc.GRPCService != "envoy.service.ext_proc.v3.ExternalProcessor" || hc.Unhealthy != 2 {
		t.Errorf("ext_proc health check %+v", c.HealthCheck)
	}
	md := cfg.ExtProc.GetGrpcService().GetInitialMetadata()
	if len(md) != 1 || md[0].GetKey() != contract.EdgeRegionMetadata || md[0].GetValue() == "" {
		t.Errorf("initial metadata %v, want the region under %s", md, contract.EdgeRegionMetadata)
	}
}
