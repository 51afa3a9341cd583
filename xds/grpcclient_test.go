package xds

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	xdsgrpc "google.golang.org/grpc/xds"

	"github.com/infergate/infergate/policies"
)

// backend is a real gRPC server (health service) on loopback; RPCs are attributed to it by peer address.
func backend(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// TestGRPCXDSClient drives grpc-go's own xDS resolver (xds:///svc) against the control plane: the weighted
// split follows capacity, changes when capacity changes, fails over to the managed fallback when every pool
// endpoint is unhealthy, and recovers.
func TestGRPCXDSClient(t *testing.T) {
	a1, a2, b1, fb := backend(t), backend(t), backend(t), backend(t)
	src := fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    fast: {costPerHour: 3, prefillTokensPerSecond: 3000, decodeTokensPerSecond: 100}
    slow: {costPerHour: 1, prefillTokensPerSecond: 2000, decodeTokensPerSecond: 100}
  models:
  - name: svc
    pools:
    - {name: a, hardwareClass: fast, engine: vllm, endpoints: [%q, %q]}
    - {name: b, hardwareClass: slow, engine: vllm, endpoints: [%q]}
    fallbacks:
    - {name: managed, baseURL: "http://%s", model: provider-svc, apiKeyFrom: "env:UNUSED", when: [unavailable]}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`, a1, a2, b1, fb)
	snap, err := policies.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp := NewServer(nil)
	if err := cp.Update(snap, nil); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	cp.Register(ctx, gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "grpc-client-1", "locality": {"region": "r1", "zone": "z1"}}}`, lis.Addr().String())
	resolver, err := xdsgrpc.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///svc", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)

	// split sends n RPCs and counts them by backend; "error" counts failed RPCs (a switch in progress).
	split := func(n int) map[string]int {
		t.Helper()
		out := map[string]int{}
		for range n {
			var p peer.Peer
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := hc.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
			ccancel()
			if err != nil {
				out["error"]++
				continue
			}
			out[p.Addr.String()]++
		}
		return out
	}
	steady := func(n int) map[string]int {
		t.Helper()
		got := split(n)
		if got["error"] > 0 {
			t.Fatalf("%d RPCs failed in a steady state: %v", got["error"], got)
		}
		return got
	}
	// eventually waits for a pushed change to reach the client.
	eventually := func(what string, cond func(map[string]int) bool) map[string]int {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := split(200)
			if cond(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: last split %v", what, got)
			}
		}
	}
	pool := func(s map[string]int, addrs ...string) int {
		n := 0
		for _, a := range addrs {
			n += s[a]
		}
		return n
	}

	// Capacity 2×3000 : 1×2000 → weights 750 : 250.
	eventually("initial split", func(s map[string]int) bool { return pool(s, a1, a2) > 0 && s[b1] > 0 })
	got := steady(1000)
	if share := float64(pool(got, a1, a2)) / 1000; share < 0.68 || share > 0.82 {
		t.Errorf("pool a share %.2f, want about 0.75 (%v)", share, got)
	}

	// a2 turns unhealthy: pool a's capacity halves → 600 : 400, and a2 gets nothing.
	if err := cp.Update(snap, fakeFleet{a2: {Healthy: false}}); err != nil {
		t.Fatal(err)
	}
	eventually("reweighting", func(s map[string]int) bool { return s[a2] == 0 })
	got = steady(1000)
	if share := float64(got[a1]) / 1000; share < 0.52 || share > 0.68 {
		t.Errorf("after a2 went down, a1 share %.2f, want about 0.6 (%v)", share, got)
	}

	// Every pool endpoint unhealthy: the fallback takes everything.
	if err := cp.Update(snap, fakeFleet{a1: {Healthy: false}, a2: {Healthy: false}, b1: {Healthy: false}}); err != nil {
		t.Fatal(err)
	}
	eventually("failover to the fallback", func(s map[string]int) bool { return s[fb] == 200 })

	// Recovery.
	if err := cp.Update(snap, nil); err != nil {
		t.Fatal(err)
	}
	eventually("recovery", func(s map[string]int) bool { return s[fb] == 0 && s["error"] == 0 && pool(s, a1, a2) > 0 && s[b1] > 0 })
	if got := steady(200); got[fb] != 0 {
		t.Errorf("traffic still on the fallback after recovery: %v", got)
	}
}
