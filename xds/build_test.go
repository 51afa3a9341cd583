package xds

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func quickstart(t *testing.T) *policies.Snapshot {
	t.Helper()
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// toYAML renders resources as YAML with sorted keys, for readable, stable goldens.
func toYAML(t *testing.T, rs []types.Resource) string {
	t.Helper()
	var docs []any
	for _, r := range rs {
		js, err := protojson.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(js, &v); err != nil {
			t.Fatal(err)
		}
		docs = append(docs, v)
	}
	out, err := yaml.Marshal(docs)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestGolden: the quickstart policy in, Envoy resources out; every resource passes ValidateAll (in Build).
func TestGolden(t *testing.T) {
	t.Setenv("TOGETHER_API_KEY", "sk-golden") // the fallback cluster gets its credential injector
	res, err := Build(quickstart(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "quickstart", res)
	// examples/regions, served to the Envoys of us-east: failover chains across regions, a residency's routes.
	regional, err := policies.LoadFile("../examples/regions/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if res, err = BuildInRegion(regional, nil, nil, "us-east"); err != nil {
		t.Fatal(err)
	}
	golden(t, "regions", res)
}

// golden compares a build's clusters, endpoints and routes with testdata/<name>.*.yaml.
func golden(t *testing.T, name string, res *Resources) {
	t.Helper()
	for kind, rs := range map[string][]types.Resource{"clusters": res.Clusters, "endpoints": res.Endpoints, "routes": res.Routes} {
		got := toYAML(t, rs)
		path := "testdata/" + name + "." + kind + ".yaml"
		if *update {
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create)", err)
		}
		if got != string(want) {
			t.Errorf("%s differs from %s; run go test ./xds -update and review the diff", kind, path)
		}
	}
}

type fakeFleet map[string]EndpointState

func (f fakeFleet) Endpoint(addr string) (EndpointState, bool) { s, ok := f[addr]; return s, ok }

func modelRoute(t *testing.T, res *Resources, model string) *routev3.RouteAction {
	t.Helper()
	ra, ok := res.modelActions[model]
	if !ok {
		t.Fatalf("no route for %s", model)
	}
	return ra
}

func weightsOf(ra *routev3.RouteAction) map[string]uint32 {
	out := map[string]uint32{}
	for _, c := range ra.GetWeightedClusters().GetClusters() {
		out[c.GetName()] = c.GetWeight().GetValue()
	}
	return out
}

func TestWeightsFollowCapacity(t *testing.T) {
	snap := quickstart(t)
	h200, l40s := contract.ClusterName("llama-3.3-70b", "llama70b-h200"), contract.ClusterName("llama-3.3-70b", "llama70b-l40s")

	res, err := Build(snap, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Two healthy replicas each: 24,000 vs 7,000 prefill tokens/s per replica.
	if w := weightsOf(modelRoute(t, res, "llama-3.3-70b")); w[h200] != 774 || w[l40s] != 226 {
		t.Fatalf("weights %v, want 774/226", w)
	}

	// One H200 replica down and the other busy: weight moves to the L40S pool; the down replica is UNHEALTHY.
	fleet := fakeFleet{"127.0.0.1:18101": {Healthy: false}, "127.0.0.1:18102": {Healthy: true, Utilisation: 0.5}}
	res2, err := Build(snap, fleet, res.Weights)
	if err != nil {
		t.Fatal(err)
	}
	w := weightsOf(modelRoute(t, res2, "llama-3.3-70b"))
	if w[h200] >= w[l40s] {
		t.Errorf("after losing capacity the h200 pool still outweighs l40s: %v", w)
	}
	for _, r := range res2.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		for _, e := range cla.GetEndpoints()[0].GetLbEndpoints() {
			addr := e.GetEndpoint().GetAddress().GetSocketAddress()
			if addr.GetPortValue() == 18101 && e.GetHealthStatus() != corev3.HealthStatus_UNHEALTHY {
				t.Error("the down replica is not published as UNHEALTHY")
			}
		}
	}

	// Hysteresis: a small utilisation change does not move the weights.
	small := fakeFleet{"127.0.0.1:18101": {Healthy: true, Utilisation: 0.05}, "127.0.0.1:18102": {Healthy: true, Utilisation: 0.05}}
	res3, _ := Build(snap, small, res.Weights)
	if w := weightsOf(modelRoute(t, res3, "llama-3.3-70b")); w[h200] != 774 || w[l40s] != 226 {
		t.Errorf("weights flapped on a small change: %v", w)
	}

	// Every self-hosted replica down: the model's managed fallback takes the route.
	down := fakeFleet{}
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			for _, ep := range p.Endpoints {
				down[ep] = EndpointState{Healthy: false}
			}
		}
	}
	res4, _ := Build(snap, down, nil)
	if c := modelRoute(t, res4, "llama-3.3-70b").GetCluster(); c != contract.FallbackClusterName("llama-3.3-70b", "together") {
		t.Errorf("all pools down: route goes to %q", c)
	}
	for _, r := range res4.Clusters {
		c := r.(*clusterv3.Cluster)
		if strings.HasPrefix(c.GetName(), "fallback/") && c.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
			t.Errorf("fallback %s without TLS", c.GetName())
		}
	}
}

// The server pushes versioned snapshots over ADS; an ADS client receives the clusters.
func TestServerServesADS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewServer(nil)
	if err := s.Update(quickstart(t), nil); err != nil {
		t.Fatal(err)
	}
	conn := dialServed(t, func(gs *grpc.Server) { s.Register(ctx, gs) })
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := ads.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// Three pools, one fallback, and two failover aggregates (the pools of the model with a fallback).
	if resp.GetVersionInfo() != "1" || len(resp.GetResources()) != 6 {
		t.Errorf("version %q, %d clusters", resp.GetVersionInfo(), len(resp.GetResources()))
	}
	// A second update is a new version; the client sees it after ACKing the first.
	if err := s.Update(quickstart(t), fakeFleet{"127.0.0.1:18121": {Healthy: false}}); err != nil {
		t.Fatal(err)
	}
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resource.ClusterType,
		VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	resp, err = ads.Recv()
	if err != nil || resp.GetVersionInfo() != "2" {
		t.Errorf("second version: %v %v", resp.GetVersionInfo(), err)
	}
}

// dialServed starts a gRPC server on a free loopback port with register's services and returns a client
// connection to it; both stop with the test.
func dialServed(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	gs := grpc.NewServer()
	register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A managed API's certificate is verified: against the system bundle by default or the policy's caFile, and
// for the host the baseURL names, as a DNS name or an IP address.
func TestProviderTLSVerifies(t *testing.T) {
	for _, tc := range []struct {
		host, ca, wantCA string
		san              tlsv3.SubjectAltNameMatcher_SanType
	}{
		{"api.together.xyz", "", policies.DefaultProviderCAFile, tlsv3.SubjectAltNameMatcher_DNS},
		{"127.0.0.1", "/tmp/ca.pem", "/tmp/ca.pem", tlsv3.SubjectAltNameMatcher_IP_ADDRESS},
	} {
		vc := providerTLS(tc.host, tc.ca).GetCommonTlsContext().GetValidationContext()
		m := vc.GetMatchTypedSubjectAltNames()
		if vc.GetTrustedCa().GetFilename() != tc.wantCA || len(m) != 1 || m[0].GetSanType() != tc.san || m[0].GetMatcher().GetExact() != tc.host {
			t.Errorf("%s: validation context %v", tc.host, vc)
		}
	}
}

// TestEnvoyRoutesNeedAPoolDecision: every route Envoy gets, except the 503 default, matches the pool header
// infergate sets on every request it routes — Envoy runs ext_proc with failure_mode_allow false, so a route
// keyed on anything else would be configuration no request reaches. The capacity weights live on in the
// proxyless gRPC clients' routes, which have no ext_proc to choose a pool.
func TestEnvoyRoutesNeedAPoolDecision(t *testing.T) {
	snap := quickstart(t)
	res, err := Build(snap, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes() {
		if r.GetName() == "default" {
			if r.GetDirectResponse().GetStatus() != 503 {
				t.Errorf("default route: %v, want a 503", r.GetAction())
			}
			continue
		}
		pool := false
		for _, h := range r.GetMatch().GetHeaders() {
			pool = pool || h.GetName() == contract.HeaderPool
		}
		if !pool {
			t.Errorf("route %s matches no %s: Envoy never routes a request there", r.GetName(), contract.HeaderPool)
		}
		if len(r.GetRoute().GetWeightedClusters().GetClusters()) > 0 {
			t.Errorf("route %s is weighted: a pool decision names one cluster", r.GetName())
		}
	}
	grpcRes, _, err := BuildGRPC(snap, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	weighted := 0
	for _, r := range grpcRes.Routes {
		for _, vh := range r.(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if len(rt.GetRoute().GetWeightedClusters().GetClusters()) > 0 {
					weighted++
				}
			}
		}
	}
	if weighted != len(snap.Policy.Spec.Models) {
		t.Errorf("%d weighted gRPC routes, want one per model (%d)", weighted, len(snap.Policy.Spec.Models))
	}
}

// rolloutFleet is a fake fleet that also publishes a rollout share.
type rolloutFleet struct {
	fakeFleet
	share float64
}

func (r rolloutFleet) Share(string) float64 { return r.share }

// The gRPC route of a rolled-out model weights its arms by the candidate's share, whatever their capacity.
func TestRolloutShareWeightsTheGRPCRoute(t *testing.T) {
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    fallbacks:\n    - name: together", "    rollout:\n      candidate: {pool: llama70b-l40s}\n"+
		"      steps: [{percent: 10}, {percent: 100}]\n    fallbacks:\n    - name: together", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	h200, l40s := contract.ClusterName("llama-3.3-70b", "llama70b-h200"), contract.ClusterName("llama-3.3-70b", "llama70b-l40s")
	for _, tc := range []struct {
		name       string
		fleet      FleetState
		wantH200   uint32
		wantL40S   uint32
		capWeights bool
	}{
		{"no share source: the baseline only", nil, 1000, 0, true},
		{"10 %", rolloutFleet{share: 0.1}, 900, 100, true},
		{"promoted", rolloutFleet{share: 1}, 0, 1000, true},
		{"the candidate down: the baseline takes its share", rolloutFleet{fakeFleet: fakeFleet{
			"127.0.0.1:18111": {Healthy: false}, "127.0.0.1:18112": {Healthy: false}}, share: 0.5}, 1000, 0, false},
	} {
		res, err := Build(snap, tc.fleet, nil)
		if err != nil {
			t.Fatal(err)
		}
		w := weightsOf(modelRoute(t, res, "llama-3.3-70b"))
		if w[h200] != tc.wantH200 || w[l40s] != tc.wantL40S {
			t.Errorf("%s: weights %v, want %d/%d", tc.name, w, tc.wantH200, tc.wantL40S)
		}
		// Hysteresis remembers capacity, not the split.
		if tc.capWeights && (res.Weights[h200] != 774 || res.Weights[l40s] != 226) {
			t.Errorf("%s: remembered weights %v", tc.name, res.Weights)
		}
	}
}

// A decode pool's engines past their sidecars are members of its cluster (so that Envoy's override_host may retry
// a split request there), with their replica's health and the replica named in their metadata; the healthy count
// is the replicas'.
func TestEnginesBehindSidecarsJoinTheCluster(t *testing.T) {
	snap, err := policies.Parse("pd.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: m
    pools:
    - {name: p, hardwareClass: h200, engine: vllm, role: prefill, endpoints: ["10.0.0.1:8000"]}
    - {name: d, hardwareClass: h200, engine: vllm, role: decode, endpoints: ["10.0.1.1:8000", "10.0.1.2:8000"], engineEndpoints: ["10.0.1.1:8001", "10.0.1.2:8001"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Build(snap, fakeFleet{"10.0.1.2:8000": {Healthy: false}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{} // address → health, and the replica it sits behind
	for _, r := range res.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		if cla.GetClusterName() != contract.ClusterName("m", "d") {
			continue
		}
		for _, e := range cla.GetEndpoints()[0].GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			behind := e.GetMetadata().GetFilterMetadata()["infergate"].GetFields()["behindSidecarOf"].GetStringValue()
			got[fmt.Sprintf("%s:%d", a.GetAddress(), a.GetPortValue())] = e.GetHealthStatus().String() + " " + behind
		}
	}
	want := map[string]string{
		"10.0.1.1:8000": "HEALTHY ", "10.0.1.1:8001": "HEALTHY 10.0.1.1:8000",
		"10.0.1.2:8000": "UNHEALTHY ", "10.0.1.2:8001": "UNHEALTHY 10.0.1.2:8000",
	}
	if !maps.Equal(got, want) {
		t.Errorf("the decode cluster's endpoints: %v, want %v", got, want)
	}
}
