package envoysim

// This file emulates how Envoy reaches the ext_proc processor through its cluster: one connection per host,
// a stream opened on a host of the cluster chosen by priority — Envoy's priority load: a priority keeps all
// streams while at least 1/1.4 of its hosts are healthy, spills the rest to the next below that, and with no
// healthy host anywhere the streams go to priority 0 (panic) — and the grpc_service's initial_metadata sent on
// every stream. Hosts leave and rejoin by the
// cluster's active gRPC health check (grpc.health.v1, health.go). A region's Envoy whose own infergate is
// down fails over so to another region's (docs/regions.md).

import (
	"context"
	"fmt"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// processorHost is one host of the processor's cluster.
type processorHost struct {
	addr     string
	priority int
	conn     *grpc.ClientConn
	client   extprocv3.ExternalProcessorClient
}

// processors are the processor cluster's hosts.
type processors struct {
	cluster string // "" for a processor outside any cluster (google_grpc, or a test's address)
	hosts   []*processorHost
	next    atomic.Uint64
}

// dialProcessors connects to every host of the processor's cluster (grpc-go connects lazily), or to addr
// alone when the test overrides it.
func dialProcessors(cfg *Config, addr string) (*processors, error) {
	ps := &processors{}
	hosts, priorities := []string{addr}, []int{0}
	if addr == "" {
		hosts = []string{cfg.ExtProcAddr}
		name := cfg.ExtProc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		if c, ok := cfg.Clusters[name]; ok && len(c.Endpoints) > 0 {
			ps.cluster, hosts, priorities = name, c.Endpoints, c.Priorities
		}
	}
	for i, h := range hosts {
		conn, err := grpc.NewClient(h, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(64<<20)),
			grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(64<<20))
		if err != nil {
			ps.close()
			return nil, fmt.Errorf("ext_proc client for %s: %w", h, err)
		}
		p := 0
		if i < len(priorities) {
			p = priorities[i]
		}
		ps.hosts = append(ps.hosts, &processorHost{addr: h, priority: p, conn: conn, client: extprocv3.NewExternalProcessorClient(conn)})
	}
	return ps, nil
}

func (ps *processors) close() {
	for _, h := range ps.hosts {
		_ = h.conn.Close()
	}
}

// host returns the conn of a host of the cluster, for its health check.
func (ps *processors) host(addr string) *processorHost {
	for _, h := range ps.hosts {
		if h.addr == addr {
			return h
		}
	}
	return nil
}

// pick chooses the host for a new stream: a priority by Envoy's priority load over the hosts health checking
// has not failed (upstream.go's priorityLoads; priority 0 when none is healthy, Envoy's panic), then the
// healthy hosts of that priority in turn.
func (ps *processors) pick(healthy func(addr string) bool) *processorHost {
	if len(ps.hosts) == 1 {
		return ps.hosts[0]
	}
	levels := 0
	for _, h := range ps.hosts {
		levels = max(levels, h.priority+1)
	}
	total, up := make([]int, levels), make([]int, levels)
	for _, h := range ps.hosts {
		total[h.priority]++
		if healthy(h.addr) {
			up[h.priority]++
		}
	}
	shares, loads := make([]float64, levels), make([]float64, levels)
	for p := range levels {
		if total[p] > 0 {
			shares[p] = float64(up[p]) / float64(total[p])
		}
	}
	level := 0
	if sum := priorityLoads(shares, loads); sum > 0 {
		level = drawPriority(loads, sum)
	}
	var at []*processorHost
	for _, h := range ps.hosts {
		if h.priority == level && (healthy(h.addr) || up[level] == 0) {
			at = append(at, h)
		}
	}
	if len(at) == 0 {
		return ps.hosts[0]
	}
	return at[int(ps.next.Add(1)%uint64(len(at)))]
}

// processorClient opens the client for a new ext_proc stream, with the grpc_service's initial metadata.
func (dp *DataPlane) processorClient(ctx context.Context, md []string) (extprocv3.ExternalProcessorClient, context.Context) {
	h := dp.procs.pick(func(addr string) bool { return !dp.health.failed(dp.procs.cluster, addr) })
	if dp.procs.cluster != "" {
		dp.health.sawTraffic(dp.procs.cluster)
	}
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	return h.client, ctx
}

// initialMetadata is the processor filter's grpc_service initial_metadata as key, value pairs.
func (dp *DataPlane) initialMetadata() []string {
	var md []string
	for _, hv := range dp.cfg.ExtProc.GetGrpcService().GetInitialMetadata() {
		md = append(md, hv.GetKey(), hv.GetValue())
	}
	return md
}

// probeProcessor runs the gRPC health check of one host of the processor's cluster: SERVING passes.
func (dp *DataPlane) probeProcessor(ctx context.Context, hc *HealthCheck, addr string) bool {
	h := dp.procs.host(addr)
	if h == nil {
		return false
	}
	resp, err := healthpb.NewHealthClient(h.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: hc.GRPCService})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
