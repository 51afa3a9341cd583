package xds

import (
	"context"
	"net"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

func exactHeader(name, value string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: value}}}}
}

// The hook, called over gRPC as Envoy Gateway calls it: infergate's clusters and secrets are added, the pool
// rules' routes point at them, and everything Envoy Gateway translated itself passes through.
// legTargets lists the clusters a cluster's upstream ext_proc filters call.
func legTargets(t *testing.T, c *clusterv3.Cluster) []string {
	t.Helper()
	opts, err := upstreamOptions(c)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, hf := range opts.GetHttpFilters() {
		ep := &extprocfilterv3.ExternalProcessor{}
		if hf.GetTypedConfig().UnmarshalTo(ep) == nil {
			out = append(out, ep.GetGrpcService().GetEnvoyGrpc().GetClusterName())
		}
	}
	return out
}

// extProcTimeout is the gRPC timeout of the first ext_proc filter in the listeners.
func extProcTimeout(t *testing.T, listeners []*listenerv3.Listener) time.Duration {
	t.Helper()
	for _, l := range listeners {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					ep := &extprocfilterv3.ExternalProcessor{}
					if hf.GetTypedConfig().UnmarshalTo(ep) == nil {
						return ep.GetGrpcService().GetTimeout().AsDuration()
					}
				}
			}
		}
	}
	t.Fatal("no ext_proc filter")
	return 0
}

const egExtProc = "envoyextensionpolicy/infergate/infergate/extproc/0"

func TestEnvoyGatewayHook(t *testing.T) {
	t.Setenv("TOGETHER_API_KEY", providerKey)
	snap := quickstart(t)
	conn := dialServed(t, func(gs *grpc.Server) {
		pb.RegisterEnvoyGatewayExtensionServer(gs, &EnvoyGatewayHook{Policy: func() *policies.Snapshot { return snap }})
	})

	placeholder := "httproute/infergate/llm/rule/0"
	req := hookRequest(placeholder)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewEnvoyGatewayExtensionClient(conn).PostTranslateModify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range resp.GetClusters() {
		if err := c.ValidateAll(); err != nil && c.GetName() != placeholder && c.GetName() != "eg-own" {
			t.Errorf("cluster %s: %v", c.GetName(), err)
		}
		clusters[c.GetName()] = c
	}
	pool := clusters[contract.ClusterName("llama-3.3-70b", "llama70b-h200")]
	if pool == nil || pool.GetType() != clusterv3.Cluster_STATIC || len(pool.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()) != 2 {
		t.Fatalf("pool cluster %v: want STATIC with its two endpoints inline", pool)
	}
	fb := clusters[contract.FallbackClusterName("llama-3.3-70b", "together")]
	if fb == nil || len(secretRefs(fb)) != 1 {
		t.Fatalf("fallback cluster %v: want its credential injector", fb)
	}
	if got := legTargets(t, fb); len(got) != 1 || got[0] != egExtProc {
		t.Errorf("the fallback's upstream ext_proc calls %v, want Envoy Gateway's cluster for infergate %s", got, egExtProc)
	}
	// Envoy Gateway's ext_proc filter has a fixed 10 s gRPC timeout: the hook gives infergate's streams 300 s,
	// as a response may stream for minutes.
	if got := extProcTimeout(t, resp.GetListeners()); got != extProcStreamTimeout {
		t.Errorf("the ext_proc filter's gRPC timeout %v, want %v", got, extProcStreamTimeout)
	}
	// Without an ext_proc filter in Envoy Gateway's listeners there is no cluster to call: no upstream ext_proc.
	req.Listeners = []*listenerv3.Listener{{Name: "infergate/llm-gateway/http"}}
	bare, err := pb.NewEnvoyGatewayExtensionClient(conn).PostTranslateModify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range bare.GetClusters() {
		if c.GetName() == fb.GetName() {
			if got := legTargets(t, c); len(got) != 0 || len(secretRefs(c)) != 1 {
				t.Errorf("without an ext_proc cluster: upstream ext_proc to %v, %d secrets", got, len(secretRefs(c)))
			}
		}
	}
	if clusters[placeholder] == nil || clusters["eg-own"] == nil || len(resp.GetListeners()) != 1 {
		t.Error("Envoy Gateway's own clusters and listeners must pass through")
	}
	secrets := map[string]bool{}
	for _, s := range resp.GetSecrets() {
		secrets[s.GetName()] = true
	}
	if !secrets["eg-cert"] || !secrets[contract.SecretName("llama-3.3-70b", "together")] {
		t.Errorf("secrets %v", secrets)
	}
	got := map[string]string{}
	for _, r := range resp.GetRoutes()[0].GetVirtualHosts()[0].GetRoutes() {
		got[r.GetName()] = r.GetRoute().GetCluster()
	}
	want := map[string]string{"h200": contract.FailoverClusterName("llama-3.3-70b", "llama70b-h200"),
		"overflow": contract.FallbackClusterName("llama-3.3-70b", "together"), "other": placeholder}
	for name, c := range want {
		if got[name] != c {
			t.Errorf("route %s → %s, want %s", name, got[name], c)
		}
	}
	if req.GetRoutes()[0].GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster() != placeholder {
		t.Error("the hook modified its input in place")
	}
}

// hookRequest is what Envoy Gateway sends the hook for deploy/envoy-gateway: a placeholder backend's cluster,
// one of its own, its listener with infergate's ext_proc filter, and the HTTPRoute's rules.
func hookRequest(placeholder string) *pb.PostTranslateModifyRequest {
	route := func(name string, headers ...*routev3.HeaderMatcher) *routev3.Route {
		return &routev3.Route{Name: name, Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: headers},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: placeholder}}}}
	}
	return &pb.PostTranslateModifyRequest{
		Clusters: []*clusterv3.Cluster{{Name: placeholder}, {Name: "eg-own"}},
		Secrets:  []*tlsv3.Secret{{Name: "eg-cert"}},
		Listeners: []*listenerv3.Listener{{Name: "infergate/llm-gateway/http", FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(&hcmv3.HttpConnectionManager{
				StatPrefix: "http", HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.ext_proc/envoyextensionpolicy/infergate/infergate/extproc/0",
					ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&extprocfilterv3.ExternalProcessor{GrpcService: &corev3.GrpcService{
						TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: egExtProc}}}})}}}})}}}}}}},
		Routes: []*routev3.RouteConfiguration{{Name: "infergate/llm-gateway/http", VirtualHosts: []*routev3.VirtualHost{{
			Name: "llm", Domains: []string{"*"}, Routes: []*routev3.Route{
				route("h200", exactHeader("x-infergate-pool", "llama70b-h200")),
				route("overflow", exactHeader("x-infergate-pool", "fallback/together")),
				route("other"),
			}}}}},
	}
}

// The hook decodes whatever Envoy Gateway (or anyone who reaches its port) sends: it never panics.
func FuzzEnvoyGatewayHook(f *testing.F) {
	seed, err := proto.Marshal(hookRequest("httproute/infergate/llm/rule/0"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	h := &EnvoyGatewayHook{Policy: func() *policies.Snapshot { return snap }}
	local := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req pb.PostTranslateModifyRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			return
		}
		resp, err := h.PostTranslateModify(local, &req)
		if err == nil && resp == nil {
			t.Fatal("nil response without error")
		}
	})
}
