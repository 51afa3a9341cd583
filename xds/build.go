package xds

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// EndpointState is what the fleet view knows of one replica.
type EndpointState struct {
	Healthy     bool
	Utilisation float64 // 0..1, from engine metrics (KV usage or queue)
}

// FleetState answers for endpoints; an endpoint it does not know is taken as healthy and idle.
type FleetState interface {
	Endpoint(addr string) (EndpointState, bool)
}

// RolloutShares, when a FleetState also implements it, gives each rolled-out model's candidate share
// (rollout.Controller through the gateway): the proxyless gRPC routes weight the arms by it.
type RolloutShares interface {
	Share(model string) float64
}

// EngineMetricsView is the scraper's view of engines, as ScrapedFleet adapts it.
type EngineMetricsView interface {
	Metrics(addr string) (fleet.EngineMetrics, bool)
}

// ScrapedFleet turns scraped engine metrics into fleet state: an endpoint without fresh metrics is unhealthy,
// and its KV-cache usage is its utilisation.
type ScrapedFleet struct{ View EngineMetricsView }

// Endpoint implements FleetState.
func (s ScrapedFleet) Endpoint(addr string) (EndpointState, bool) {
	m, fresh := s.View.Metrics(addr)
	return EndpointState{Healthy: fresh, Utilisation: m.KVUtil}, true
}

// Resources is one consistent set of Envoy resources.
type Resources struct {
	Clusters  []types.Resource
	Endpoints []types.Resource
	Routes    []types.Resource
	// Secrets are the managed APIs' keys, for the credential injector on their clusters (SDS over ADS).
	Secrets []types.Resource
	// Weights are the per-model pool weights used in the routes, for hysteresis on the next build.
	Weights map[string]uint32
	// modelActions are each model's capacity-weighted route action, for the proxyless gRPC clients, which
	// have no ext_proc to choose a pool (BuildGRPC). Envoy's route configuration has none: every request
	// infergate routes names its pool, and with failure_mode_allow false Envoy routes no other.
	modelActions map[string]*routev3.RouteAction
	// Warnings say what the build could not do (a fallback whose key is missing), without secrets.
	Warnings []string
}

// Build turns a policy and the fleet's state into clusters, endpoints and routes. previous, when not nil,
// holds the last weights: a pool's weight only changes when it moved by more than 10 %, so routes do not flap.
func Build(snap *policies.Snapshot, fleet FleetState, previous map[string]uint32) (*Resources, error) {
	return BuildInRegion(snap, fleet, previous, "")
}

// BuildInRegion is Build for the Envoys of one region of the policy's spec.regions (infergate serve
// --region): pools fail over to the other regions' in its order (see Regions in Envoy's resources).
func BuildInRegion(snap *policies.Snapshot, fleet FleetState, previous map[string]uint32, region string) (*Resources, error) {
	out := &Resources{Weights: map[string]uint32{}, modelActions: map[string]*routev3.RouteAction{}}
	vh := &routev3.VirtualHost{Name: "llm", Domains: []string{"*"}}
	for i := range snap.Policy.Spec.Models {
		m := &snap.Policy.Spec.Models[i]
		var weighted []*routev3.WeightedCluster_ClusterWeight
		capacities := map[string]float64{}
		for j := range m.Pools {
			p := &m.Pools[j]
			name := contract.ClusterName(m.Name, p.Name)
			pc := poolCluster(m, p)
			target := name
			chain := failoverChain(snap, m, p, region, nil)
			if len(chain) > 0 {
				// A pool that fails as a whole (every replica ejected or unhealthy) hands over to the next
				// region's pools and the managed API: its route goes to an aggregate of them, and the whole pool
				// may be ejected.
				pc.OutlierDetection.MaxEjectionPercent = wrapperspb.UInt32(100)
				target = contract.FailoverClusterName(m.Name, p.Name)
			}
			out.Clusters = append(out.Clusters, pc)
			if len(chain) > 0 {
				out.Clusters = append(out.Clusters, failoverCluster(target, append([]string{name}, chain...)...))
			}
			vh.Routes = append(vh.Routes, residentRoutes(snap, m, p, region, out)...)
			cla, healthy, util := poolEndpoints(m, p, fleet)
			out.Endpoints = append(out.Endpoints, cla)
			hc := snap.Policy.Spec.HardwareClasses[p.HardwareClass]
			// Live capacity: healthy replicas × class throughput × headroom; a prefill-only pool takes no
			// whole request, so proxyless clients send it none.
			if p.ServesWhole() {
				capacities[name] = float64(healthy) * hc.PrefillTokensPerSecond * (1 - util)
			}
			vh.Routes = append(vh.Routes, &routev3.Route{
				Name:   contract.ClusterName(m.Name, p.Name),
				Match:  headerMatch(contract.HeaderPool, p.Name),
				Action: &routev3.Route_Route{Route: poolAction(m, chain, target, snap.UpstreamIdleTimeout())},
			})
		}
		nearestCapacity(snap, m, region, capacities)
		weights := capacityWeights(capacities, previous)
		maps.Copy(out.Weights, weights) // hysteresis follows capacity; the rollout's split applies on top
		if plan, ok := snap.Rollout(m); ok {
			weights = splitWeights(m, plan, rolloutShare(fleet, m.Name), weights)
		}
		for j := range m.Pools {
			name := contract.ClusterName(m.Name, m.Pools[j].Name)
			if weights[name] > 0 {
				weighted = append(weighted, &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(weights[name])})
			}
		}
		for _, f := range m.Fallbacks {
			c, err := fallbackCluster(m, &f)
			if err != nil {
				return nil, err
			}
			secret := ""
			if key, err := fallbackKey(&f); err != nil {
				out.Warnings = append(out.Warnings, err.Error()+"; requests to it go without a credential")
			} else {
				secret = contract.SecretName(m.Name, f.Name)
				out.Secrets = append(out.Secrets, credentialSecret(secret, key))
			}
			upstreamFilters(c, m.Name, f.Name, secret)
			out.Clusters = append(out.Clusters, c)
			// infergate names a managed API as the pool "fallback/<name>" when it sends overflow there. The
			// provider expects its own Host.
			vh.Routes = append(vh.Routes, &routev3.Route{
				Name:  contract.FallbackClusterName(m.Name, f.Name),
				Match: headerMatch(contract.HeaderPool, contract.FallbackPool(f.Name)),
				Action: &routev3.Route_Route{Route: routeAction(&routev3.RouteAction{
					ClusterSpecifier:     &routev3.RouteAction_Cluster{Cluster: contract.FallbackClusterName(m.Name, f.Name)},
					HostRewriteSpecifier: &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)},
				}, snap.UpstreamIdleTimeout())},
			})
		}
		action := &routev3.RouteAction{}
		if len(weighted) == 0 && len(m.Fallbacks) > 0 {
			// Every self-hosted pool is down: the model's first fallback takes the traffic.
			action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: contract.FallbackClusterName(m.Name, m.Fallbacks[0].Name)}
		} else if len(weighted) > 0 {
			action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: weighted}}
		} else {
			continue
		}
		out.modelActions[m.Name] = routeAction(action, snap.UpstreamIdleTimeout())
	}
	vh.Routes = append(vh.Routes, &routev3.Route{
		Name:  "default",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 503, Body: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: `{"error":{"message":"The routing service is unavailable; please retry.","type":"service_unavailable_error","param":null,"code":"routing_unavailable"}}`}}}},
	})
	out.Routes = []types.Resource{&routev3.RouteConfiguration{Name: RouteConfigName, VirtualHosts: []*routev3.VirtualHost{vh}}}
	for _, group := range [][]types.Resource{out.Clusters, out.Endpoints, out.Routes, out.Secrets} {
		for _, r := range group {
			if v, ok := r.(interface{ ValidateAll() error }); ok {
				if err := v.ValidateAll(); err != nil {
					return nil, fmt.Errorf("generated resource fails validation: %w", err)
				}
			}
		}
	}
	return out, nil
}

func rolloutShare(fleet FleetState, model string) float64 {
	if rs, ok := fleet.(RolloutShares); ok {
		return rs.Share(model)
	}
	return 0
}

// splitWeights divides a rolled-out model's capacity weights between its arms as ext_proc divides its
// requests: the candidate pool takes share of the total, the baseline pools the rest in proportion to their
// capacity, pools of neither arm nothing. A candidate with no capacity leaves its share to the baseline; a
// candidate that is a served model name cannot be renamed for gRPC clients, which keep the baseline.
func splitWeights(m *policies.Model, plan *policies.RolloutPlan, share float64, weights map[string]uint32) map[string]uint32 {
	out := map[string]uint32{}
	var baseTotal uint32
	for _, p := range plan.Baseline {
		baseTotal += weights[contract.ClusterName(m.Name, p.Name)]
	}
	cand := ""
	if plan.Candidate != nil && weights[contract.ClusterName(m.Name, plan.Candidate.Name)] > 0 {
		cand = contract.ClusterName(m.Name, plan.Candidate.Name)
	}
	switch { // an arm without capacity leaves all to the other
	case cand == "":
		share = 0
	case baseTotal == 0:
		share = 1
	}
	if cand != "" {
		out[cand] = uint32(math.Round(1000 * share))
	}
	for _, p := range plan.Baseline {
		name := contract.ClusterName(m.Name, p.Name)
		if baseTotal > 0 {
			out[name] = uint32(math.Round(1000 * (1 - share) * float64(weights[name]) / float64(baseTotal)))
		}
	}
	return out
}

// failoverFallback is the fallback a model's pools fail over to inside Envoy: the first whose policy allows
// it when self-hosted capacity is unavailable; nil when there is none.
func failoverFallback(m *policies.Model) *policies.Fallback {
	for i := range m.Fallbacks {
		if slices.Contains(m.Fallbacks[i].When, policies.WhenUnavailable) {
			return &m.Fallbacks[i]
		}
	}
	return nil
}

// failoverCluster is an aggregate of a pool and its model's fallback: Envoy sends to the pool while enough of
// its replicas are available (healthy in EDS, not ejected by outlier detection) and spills to the managed API
// as they are not. (An aggregate and not EDS priorities because the managed API needs its own discovery type,
// TLS and upstream filters; Envoy requires CLUSTER_PROVIDED here, grpc-go clients never see these clusters.)
func failoverCluster(name string, children ...string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name: name,
		ClusterDiscoveryType: &clusterv3.Cluster_ClusterType{ClusterType: &clusterv3.Cluster_CustomClusterType{
			Name: "envoy.clusters.aggregate", TypedConfig: mustAny(&aggregatev3.ClusterConfig{Clusters: children})}},
		LbPolicy:       clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout: durationpb.New(time.Second),
	}
}

// poolAction is a pool route's action: to its cluster or failover aggregate, with the retry priority that moves
// retries to the next region when the chain holds one.
func poolAction(m *policies.Model, chain []string, target string, idle time.Duration) *routev3.RouteAction {
	a := poolRouteAction(target, len(chain) > 0, idle)
	if crossRegion(m, chain) {
		a = withRetryPriority(a)
	}
	return a
}

// poolRouteAction sends the requests infergate routed to a pool to its cluster (or failover aggregate), and
// retries a failed attempt — connection refused or reset, or a 5xx before any byte reached the client — on
// another replica (never the same one again); those failures also feed the pool's outlier detection.
//
// With a failover aggregate, Host becomes the upstream host's name: the managed API's DNS name on that leg (the
// provider expects its own Host), and unchanged for the pool's EDS endpoints, which carry no hostname.
func poolRouteAction(cluster string, failover bool, idle time.Duration) *routev3.RouteAction {
	a := routeAction(&routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}, idle)
	if failover {
		a.HostRewriteSpecifier = &routev3.RouteAction_AutoHostRewrite{AutoHostRewrite: wrapperspb.Bool(true)}
	}
	a.RetryPolicy = &routev3.RetryPolicy{
		RetryOn: "connect-failure,refused-stream,reset,5xx", NumRetries: wrapperspb.UInt32(2),
		RetryHostPredicate: []*routev3.RetryPolicy_RetryHostPredicate{{Name: "envoy.retry_host_predicates.previous_hosts",
			ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: mustAny(&previoushostsv3.PreviousHostsPredicate{})}}},
		HostSelectionRetryMaxAttempts: 3,
	}
	return a
}

func routeAction(a *routev3.RouteAction, idle time.Duration) *routev3.RouteAction {
	a.Timeout = durationpb.New(300 * time.Second)
	a.IdleTimeout = durationpb.New(idle)
	a.RetryPolicy = &routev3.RetryPolicy{RetryOn: "connect-failure,refused-stream", NumRetries: wrapperspb.UInt32(2)}
	return a
}

func headerMatch(name, value string) *routev3.RouteMatch {
	return &routev3.RouteMatch{
		PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"},
		Headers: []*routev3.HeaderMatcher{{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: value}}}}},
	}
}

// capacityWeights turns capacities into integer weights out of 1000, keeping a previous weight unless the new
// one differs by more than 10 %.
func capacityWeights(capacities map[string]float64, previous map[string]uint32) map[string]uint32 {
	total := 0.0
	for _, c := range capacities {
		total += c
	}
	out := map[string]uint32{}
	for name, c := range capacities {
		if total == 0 {
			out[name] = 0
			continue
		}
		w := uint32(math.Round(1000 * c / total))
		if c > 0 && w == 0 {
			w = 1
		}
		if prev, ok := previous[name]; ok && prev > 0 && w > 0 && math.Abs(float64(w)-float64(prev)) <= 0.1*float64(prev) {
			w = prev
		}
		out[name] = w
	}
	return out
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // static messages: cannot fail
	}
	return a
}

// overrideHostPolicy reads x-gateway-destination-endpoint from the header, then from envoy.lb metadata, and
// falls back to least request.
func overrideHostPolicy() *clusterv3.LoadBalancingPolicy {
	oh := &overridehostv3.OverrideHost{
		OverrideHostSources: []*overridehostv3.OverrideHost_OverrideHostSource{
			{Header: contract.HeaderDestination},
			{Metadata: &metadatav3.MetadataKey{Key: contract.MetadataNamespace, Path: []*metadatav3.MetadataKey_PathSegment{
				{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: contract.HeaderDestination}}}}},
		},
		SelectedHostKey: &metadatav3.MetadataKey{Key: contract.MetadataNamespace, Path: []*metadatav3.MetadataKey_PathSegment{
			{Segment: &metadatav3.MetadataKey_PathSegment_Key{Key: contract.ServedEndpointKey}}}},
		FallbackPolicy: &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
			TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.least_request",
				TypedConfig: mustAny(&leastrequestv3.LeastRequest{})}}}},
	}
	return &clusterv3.LoadBalancingPolicy{Policies: []*clusterv3.LoadBalancingPolicy_Policy{{
		TypedExtensionConfig: &corev3.TypedExtensionConfig{Name: "envoy.load_balancing_policies.override_host", TypedConfig: mustAny(oh)}}}}
}

func infergateMetadata(fields map[string]string) *corev3.Metadata {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range fields {
		s.Fields[k] = structpb.NewStringValue(v)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"infergate": s}}
}

func poolCluster(m *policies.Model, p *policies.Pool) *clusterv3.Cluster {
	n := uint32(len(p.Endpoints))
	return &clusterv3.Cluster{
		Name:                 contract.ClusterName(m.Name, p.Name),
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
		ConnectTimeout:      durationpb.New(time.Second),
		LoadBalancingPolicy: overrideHostPolicy(),
		// Envoy probes each replica's /health (vLLM, SGLang and TensorRT-LLM all serve it) every two seconds,
		// with or without traffic — Envoy's default no_traffic_interval is 60 s, and a pool whose traffic went to
		// the managed API carries none. A passing probe brings a replica outlier detection ejected back at once
		// (successful_active_health_check_uneject_host, default true), so recovered pools stop paying for the
		// managed API within seconds instead of after the ejection time.
		HealthChecks: []*corev3.HealthCheck{{
			Timeout: durationpb.New(time.Second), Interval: durationpb.New(2 * time.Second),
			NoTrafficInterval: durationpb.New(2 * time.Second), UnhealthyThreshold: wrapperspb.UInt32(2),
			HealthyThreshold: wrapperspb.UInt32(1),
			HealthChecker:    &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{Path: "/health"}},
		}},
		// A replica that keeps failing leaves the rotation; at most half a pool is ejected at once.
		OutlierDetection: &clusterv3.OutlierDetection{
			Consecutive_5Xx: wrapperspb.UInt32(5), Interval: durationpb.New(5 * time.Second),
			BaseEjectionTime: durationpb.New(30 * time.Second), MaxEjectionPercent: wrapperspb.UInt32(50),
		},
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority: corev3.RoutingPriority_DEFAULT, MaxRequests: wrapperspb.UInt32(1024 * n),
			MaxPendingRequests: wrapperspb.UInt32(1024), MaxRetries: wrapperspb.UInt32(64),
		}}},
		Metadata: infergateMetadata(map[string]string{"model": m.Name, "pool": p.Name, "hardwareClass": p.HardwareClass, "engine": p.Engine}),
	}
}

// poolEndpoints publishes a pool's replicas with their health; it returns the healthy count and the mean
// utilisation of the healthy ones.
func poolEndpoints(m *policies.Model, p *policies.Pool, fleet FleetState) (*endpointv3.ClusterLoadAssignment, int, float64) {
	// grpc-go rejects a locality without an ID and one without a weight.
	lle := &endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Region: cmp.Or(p.Region, "infergate"), Zone: p.Name},
		LoadBalancingWeight: wrapperspb.UInt32(1)}
	healthy, utilSum := 0, 0.0
	for _, ep := range p.Endpoints {
		host, portStr, _ := net.SplitHostPort(ep) // validated by the policy loader
		port, _ := strconv.Atoi(portStr)
		st := EndpointState{Healthy: true}
		if fleet != nil {
			if s, ok := fleet.Endpoint(ep); ok {
				st = s
			}
		}
		hs := corev3.HealthStatus_HEALTHY
		if !st.Healthy {
			hs = corev3.HealthStatus_UNHEALTHY
		} else {
			healthy++
			utilSum += min(max(st.Utilisation, 0), 1)
		}
		md := map[string]string{"pool": p.Name, "hardwareClass": p.HardwareClass, "engine": p.Engine}
		lle.LbEndpoints = append(lle.LbEndpoints, lbEndpoint(host, port, hs, md))
		if engine := p.EngineEndpoint(ep); engine != "" {
			// The engine behind the replica's sidecar: a member of the cluster, so that Envoy's override_host
			// may retry a split request there (policies.Pool.EngineEndpoints); it shares the replica's health.
			host, portStr, _ := net.SplitHostPort(engine)
			port, _ := strconv.Atoi(portStr)
			md["behindSidecarOf"] = ep
			lle.LbEndpoints = append(lle.LbEndpoints, lbEndpoint(host, port, hs, md))
		}
	}
	util := 0.0
	if healthy > 0 {
		util = utilSum / float64(healthy)
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: contract.ClusterName(m.Name, p.Name), Endpoints: []*endpointv3.LocalityLbEndpoints{lle}}, healthy, util
}

// lbEndpoint is one EDS endpoint with infergate's metadata.
func lbEndpoint(host string, port int, hs corev3.HealthStatus, md map[string]string) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
			Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}}},
		HealthStatus: hs,
		Metadata:     infergateMetadata(md),
	}
}

// fallbackCluster reaches a managed API over TLS with SNI, resolving its host by DNS.
func fallbackCluster(m *policies.Model, f *policies.Fallback) (*clusterv3.Cluster, error) {
	u, err := url.Parse(f.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("fallback %s: %w", f.Name, err)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	p, _ := strconv.Atoi(port)
	name := contract.FallbackClusterName(m.Name, f.Name)
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS},
		DnsLookupFamily:      clusterv3.Cluster_V4_PREFERRED,
		ConnectTimeout:       durationpb.New(5 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}}}}}},
		}}},
		Metadata: infergateMetadata(map[string]string{"model": m.Name, "fallback": f.Name, "providerModel": f.Model}),
	}
	if u.Scheme == "https" {
		c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
			TypedConfig: mustAny(providerTLS(host, f.CAFile))}}
	}
	return c, nil
}

// providerTLS is the TLS a managed API is reached over: its certificate must chain to caFile (the system bundle
// by default) and name host. Without a validation context Envoy accepts any certificate — and the credential
// injector would hand the provider key to whoever answered.
func providerTLS(host, caFile string) *tlsv3.UpstreamTlsContext {
	if caFile == "" {
		caFile = policies.DefaultProviderCAFile
	}
	san := tlsv3.SubjectAltNameMatcher_DNS
	if _, err := netip.ParseAddr(host); err == nil {
		san = tlsv3.SubjectAltNameMatcher_IP_ADDRESS
	}
	return &tlsv3.UpstreamTlsContext{Sni: host, CommonTlsContext: &tlsv3.CommonTlsContext{
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: caFile}},
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{SanType: san,
				Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: host}}}},
		}},
	}}
}

// consistent checks the references inside a resource set: every EDS cluster has its endpoints and every
// endpoint set its cluster, and every cluster a route names exists.
func consistent(res *Resources) error {
	clusters, eds := map[string]bool{}, map[string]bool{}
	for _, r := range res.Clusters {
		c := r.(*clusterv3.Cluster)
		clusters[c.GetName()] = true
		if c.GetType() == clusterv3.Cluster_EDS {
			eds[c.GetName()] = true
		}
	}
	for _, r := range res.Endpoints {
		name := r.(*endpointv3.ClusterLoadAssignment).GetClusterName()
		if !eds[name] {
			return fmt.Errorf("endpoints for %q, which is not an EDS cluster", name)
		}
		delete(eds, name)
	}
	for name := range eds {
		return fmt.Errorf("EDS cluster %q has no endpoints", name)
	}
	secrets := map[string]bool{}
	for _, r := range res.Secrets {
		secrets[r.(*tlsv3.Secret).GetName()] = true
	}
	for _, r := range res.Clusters {
		for _, name := range secretRefs(r.(*clusterv3.Cluster)) {
			if !secrets[name] {
				return fmt.Errorf("cluster %q injects secret %q, which is not served", r.(*clusterv3.Cluster).GetName(), name)
			}
		}
	}
	for _, r := range res.Routes {
		for _, vh := range r.(*routev3.RouteConfiguration).GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				names := []string{rt.GetRoute().GetCluster()}
				for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
					names = append(names, wc.GetName())
				}
				for _, n := range names {
					if n != "" && !clusters[n] {
						return fmt.Errorf("route %q names unknown cluster %q", rt.GetName(), n)
					}
				}
			}
		}
	}
	return nil
}
