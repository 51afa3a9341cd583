package xds

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/policies"
)

// GRPCListenerName is the listener a grpc-go client resolves for a model: `xds:///<model>`.
func GRPCListenerName(model string) string { return model }

// grpcRouteName is the route configuration of a model's grpc-go listener.
func grpcRouteName(model string) string { return "grpc/" + model }

// BuildGRPC derives the resource set for proxyless grpc-go clients from the Envoy one: grpc-go knows neither
// the override_host policy nor TLS without a certificate provider, so pool clusters use round robin, plain-text
// fallbacks are kept, and each model gets an api_listener and a route configuration of its own.
func BuildGRPC(snap *policies.Snapshot, fleet FleetState, previous map[string]uint32) (*Resources, []types.Resource, error) {
	return buildGRPC(snap, fleet, previous, "")
}

// buildGRPC is BuildGRPC for the clients of one region (see BuildInRegion).
func buildGRPC(snap *policies.Snapshot, fleet FleetState, previous map[string]uint32, region string) (*Resources, []types.Resource, error) {
	res, err := BuildInRegion(snap, fleet, previous, region)
	if err != nil {
		return nil, nil, err
	}
	var clusters []types.Resource
	for _, r := range res.Clusters {
		c := proto.Clone(r.(*clusterv3.Cluster)).(*clusterv3.Cluster)
		if c.GetTransportSocket() != nil {
			continue // TLS fallbacks need a certificate provider in the client's bootstrap
		}
		if c.GetClusterType() != nil {
			continue // failover aggregates serve the ext_proc's pool routes, which grpc-go clients do not use
		}
		c.LoadBalancingPolicy = nil
		c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
		clusters = append(clusters, c)
	}
	res.Clusters = clusters
	kept := map[string]bool{}
	for _, r := range clusters {
		kept[r.(*clusterv3.Cluster).GetName()] = true
	}
	var routes, listeners []types.Resource
	for i := range snap.Policy.Spec.Models {
		m := &snap.Policy.Spec.Models[i]
		built, ok := res.modelActions[m.Name]
		if !ok || (built.GetCluster() != "" && !kept[built.GetCluster()]) {
			continue
		}
		action := proto.Clone(built).(*routev3.RouteAction)
		// grpc-go retries on gRPC status codes only.
		action.RetryPolicy = &routev3.RetryPolicy{RetryOn: "unavailable", NumRetries: wrapperspb.UInt32(2)}
		action.Timeout = nil
		routes = append(routes, &routev3.RouteConfiguration{Name: grpcRouteName(m.Name), VirtualHosts: []*routev3.VirtualHost{{
			Name: m.Name, Domains: []string{"*"},
			Routes: []*routev3.Route{{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: ""}},
				Action: &routev3.Route_Route{Route: action}}},
		}}})
		hcm := &hcmv3.HttpConnectionManager{
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
				ConfigSource:    &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
				RouteConfigName: grpcRouteName(m.Name),
			}},
			HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router",
				ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}},
		}
		listeners = append(listeners, &listenerv3.Listener{Name: GRPCListenerName(m.Name), ApiListener: &listenerv3.ApiListener{ApiListener: mustAny(hcm)}})
	}
	res.Routes = routes
	for _, l := range listeners {
		if err := l.(*listenerv3.Listener).ValidateAll(); err != nil {
			return nil, nil, fmt.Errorf("grpc listener: %w", err)
		}
	}
	return res, listeners, nil
}
