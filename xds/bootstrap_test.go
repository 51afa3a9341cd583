package xds

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/test/envoysim"
)

// TestXDSBootstrap: deploy/envoy/envoy-xds.yaml plus what infergate's control plane serves to its node is a
// complete Envoy configuration — the listener's RDS name is served, every cluster a route names is served
// (or static), every EDS cluster has its endpoints, and the static clusters reach infergate's default ports.
func TestXDSBootstrap(t *testing.T) {
	raw, err := os.ReadFile("../deploy/envoy/envoy-xds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := envoysim.ParseBootstrap(raw)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	static := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		static[c.GetName()] = c
	}
	port := func(c *clusterv3.Cluster) uint32 {
		return c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	}
	ads := bs.GetDynamicResources().GetAdsConfig().GetGrpcServices()
	if len(ads) != 1 || static[ads[0].GetEnvoyGrpc().GetClusterName()] == nil || port(static[ads[0].GetEnvoyGrpc().GetClusterName()]) != 18000 {
		t.Fatalf("ADS must use a static cluster at infergate's --xds-addr port 18000: %v", ads)
	}
	if c := static[ExtProcClusterName]; c == nil || port(c) != 9002 {
		t.Fatalf("static %s cluster at port 9002 missing", ExtProcClusterName)
	}
	if bs.GetDynamicResources().GetCdsConfig().GetAds() == nil {
		t.Error("CDS must come over ADS")
	}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if hcm.GetRds().GetRouteConfigName() != RouteConfigName || hcm.GetRds().GetConfigSource().GetAds() == nil {
		t.Fatalf("listener must take route configuration %q over ADS, has %v", RouteConfigName, hcm.GetRds())
	}

	// infergate's control plane, and an ADS client with the bootstrap's node.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := NewServer(nil)
	if err := s.Update(quickstart(t), nil); err != nil {
		t.Fatal(err)
	}
	conn := dialServed(t, func(gs *grpc.Server) { s.Register(ctx, gs) })
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := proto.Clone(bs.GetNode()).(*corev3.Node)
	node.UserAgentName = "envoy"
	fetch := func(typeURL string, names ...string) [][]byte {
		t.Helper()
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", typeURL, err)
		}
		var out [][]byte
		for _, a := range resp.GetResources() {
			out = append(out, a.GetValue())
		}
		return out
	}

	served := map[string]bool{}
	var eds []string
	for _, r := range fetch(resource.ClusterType) {
		var c clusterv3.Cluster
		if err := proto.Unmarshal(r, &c); err != nil {
			t.Fatal(err)
		}
		if _, clash := static[c.GetName()]; clash {
			t.Errorf("served cluster %s clashes with a static one", c.GetName())
		}
		served[c.GetName()] = true
		if c.GetType() == clusterv3.Cluster_EDS {
			eds = append(eds, c.GetName())
		}
	}
	for _, r := range fetch(resource.EndpointType, eds...) {
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(r, &cla); err != nil {
			t.Fatal(err)
		}
		served["eds:"+cla.GetClusterName()] = true
	}
	for _, name := range eds {
		if !served["eds:"+name] {
			t.Errorf("EDS cluster %s has no endpoints served", name)
		}
	}
	routes := fetch(resource.RouteType, RouteConfigName)
	if len(routes) != 1 {
		t.Fatalf("route configuration %q: %d served", RouteConfigName, len(routes))
	}
	var rc routev3.RouteConfiguration
	if err := proto.Unmarshal(routes[0], &rc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			var names []string
			if c := r.GetRoute().GetCluster(); c != "" {
				names = append(names, c)
			}
			for _, w := range r.GetRoute().GetWeightedClusters().GetClusters() {
				names = append(names, w.GetName())
			}
			for _, name := range names {
				n++
				if !served[name] && static[name] == nil {
					t.Errorf("route %s names cluster %s, which is neither served nor static", r.GetName(), name)
				}
			}
		}
	}
	if n < 4 {
		t.Errorf("only %d route targets in %s", n, RouteConfigName)
	}
	t.Logf("%d clusters, %d EDS, %d route targets served for node %s", len(served)-len(eds), len(eds), n, node.GetId()+"/"+strconv.Quote(node.GetUserAgentName()))
}
