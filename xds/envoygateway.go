package xds

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// EnvoyGatewayHook is an Envoy Gateway extension server: its extension manager calls the post-translation
// hook with the xDS it translated from the Gateway API objects (deploy/envoy-gateway/: the Gateway, the
// EnvoyExtensionPolicy that inserts infergate's ext_proc, the HTTPRoute whose rules match the pool infergate
// chose). The hook adds infergate's pool and managed-API clusters — pools with their endpoints inline, as Envoy
// Gateway serves no EDS for them; fallbacks with their credential injector and SDS secrets — and points every
// route that matches an x-infergate-pool value at the right cluster. Everything else passes through untouched.
type EnvoyGatewayHook struct {
	pb.UnimplementedEnvoyGatewayExtensionServer
	// Policy returns the live policy; Fleet, when set, the live health and utilisation of its endpoints.
	Policy func() *policies.Snapshot
	Fleet  FleetState
}

// EnvoyGatewayHookAddr is serve's default address for the hook, which the Envoy Gateway manifest names.
const EnvoyGatewayHookAddr = ":18002"

// PostTranslateModify implements the hook. Its answer carries the managed-API keys, so only an authenticated
// caller gets one: Envoy Gateway with a client certificate the server's client CA verifies, or a caller on
// loopback when the server runs without TLS.
func (h *EnvoyGatewayHook) PostTranslateModify(ctx context.Context, req *pb.PostTranslateModifyRequest) (*pb.PostTranslateModifyResponse, error) {
	if !PeerOf(ctx).Trusted() {
		return nil, status.Error(codes.PermissionDenied, "the Envoy Gateway hook answers only authenticated callers: configure mTLS (a client certificate from the server's client CA)")
	}
	snap := h.Policy()
	res, err := Build(snap, h.Fleet, nil)
	if err != nil {
		return nil, fmt.Errorf("infergate resources: %w", err)
	}
	cla := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, r := range res.Endpoints {
		c := r.(*endpointv3.ClusterLoadAssignment)
		cla[c.GetClusterName()] = c
	}
	ours := map[string]*clusterv3.Cluster{}
	extProc := extProcClusterOf(req.GetListeners())
	for _, r := range res.Clusters {
		c := proto.Clone(r.(*clusterv3.Cluster)).(*clusterv3.Cluster)
		if err := retargetLegFilter(c, extProc); err != nil {
			return nil, fmt.Errorf("cluster %s: %w", c.GetName(), err)
		}
		if c.GetType() == clusterv3.Cluster_EDS {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
			c.EdsClusterConfig = nil
			c.LoadAssignment = cla[c.GetName()]
		}
		ours[c.GetName()] = c
	}
	listeners, err := raiseExtProcTimeouts(req.GetListeners(), extProc)
	if err != nil {
		return nil, err
	}
	out := &pb.PostTranslateModifyResponse{Listeners: listeners}
	for _, c := range req.GetClusters() {
		if _, replaced := ours[c.GetName()]; !replaced {
			out.Clusters = append(out.Clusters, c)
		}
	}
	for _, r := range res.Clusters { // policy order
		out.Clusters = append(out.Clusters, ours[r.(*clusterv3.Cluster).GetName()])
	}
	secrets := map[string]bool{}
	for _, r := range res.Secrets {
		secrets[r.(*tlsv3.Secret).GetName()] = true
	}
	for _, s := range req.GetSecrets() {
		if !secrets[s.GetName()] {
			out.Secrets = append(out.Secrets, s)
		}
	}
	for _, r := range res.Secrets {
		out.Secrets = append(out.Secrets, r.(*tlsv3.Secret))
	}
	for _, rc := range req.GetRoutes() {
		rc = proto.Clone(rc).(*routev3.RouteConfiguration)
		for _, vh := range rc.GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if name := poolClusterFor(snap, rt.GetMatch()); name != "" && rt.GetRoute() != nil {
					rt.GetRoute().ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: name}
				}
			}
		}
		out.Routes = append(out.Routes, rc)
	}
	return out, nil
}

// poolClusterFor returns the cluster of the pool (or "fallback/<name>") a route's x-infergate-pool header
// matcher names, narrowed by its x-infergate-model matcher when it has one; "" when the route matches no
// infergate pool.
func poolClusterFor(snap *policies.Snapshot, m *routev3.RouteMatch) string {
	var pool, model string
	for _, h := range m.GetHeaders() {
		exact := h.GetStringMatch().GetExact()
		switch strings.ToLower(h.GetName()) {
		case contract.HeaderPool:
			pool = exact
		case contract.HeaderModel:
			model = exact
		}
	}
	return ClusterForPoolHeader(snap, model, pool)
}

// ClusterForPoolHeader is the cluster an x-infergate-pool value (a pool name, or "fallback/<name>") selects,
// within the model an x-infergate-model value names ("" for any); "" when no pool of the policy matches.
func ClusterForPoolHeader(snap *policies.Snapshot, model, pool string) string {
	if pool == "" {
		return ""
	}
	for _, mdl := range snap.Policy.Spec.Models {
		if model != "" && mdl.Name != model {
			continue
		}
		if name, fallback := contract.ParsePool(pool); fallback {
			for _, f := range mdl.Fallbacks {
				if f.Name == name {
					return contract.FallbackClusterName(mdl.Name, f.Name)
				}
			}
			continue
		}
		for _, p := range mdl.Pools {
			if p.Name == pool {
				if failoverFallback(&mdl) != nil {
					return contract.FailoverClusterName(mdl.Name, p.Name)
				}
				return contract.ClusterName(mdl.Name, p.Name)
			}
		}
	}
	return ""
}

// extProcStreamTimeout is the gRPC timeout of infergate's ext_proc streams, as in the static configs: the stream
// lasts as long as the response it processes, minutes for a long generation.
const extProcStreamTimeout = 300 * time.Second

// raiseExtProcTimeouts sets the gRPC timeout of the ext_proc filters that call infergate (cluster extProc) to
// extProcStreamTimeout. Envoy Gateway builds them with a fixed 10 s, which would cut a response streamed for
// longer, and its EnvoyExtensionPolicy has no field for it. Other filters and listeners pass unchanged.
func raiseExtProcTimeouts(listeners []*listenerv3.Listener, extProc string) ([]*listenerv3.Listener, error) {
	if extProc == "" {
		return listeners, nil
	}
	out := make([]*listenerv3.Listener, 0, len(listeners))
	for _, l := range listeners {
		l = proto.Clone(l).(*listenerv3.Listener)
		var err error
		eachHCM(l, func(f *listenerv3.Filter, hcm *hcmv3.HttpConnectionManager) bool {
			changed := false
			for _, hf := range hcm.GetHttpFilters() {
				ep := extProcOf(hf)
				if ep == nil || ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != extProc || ep.GetGrpcService().GetTimeout().AsDuration() >= extProcStreamTimeout {
					continue
				}
				ep.GrpcService.Timeout = durationpb.New(extProcStreamTimeout)
				var a *anypb.Any
				if a, err = anypb.New(ep); err != nil {
					return false
				}
				hf.ConfigType, changed = &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}, true
			}
			if changed {
				var a *anypb.Any
				if a, err = anypb.New(hcm); err != nil {
					return false
				}
				f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// extProcClusterOf finds the cluster through which Envoy Gateway reaches infergate's ext_proc (the one it built
// for the EnvoyExtensionPolicy): that of the first ext_proc HTTP filter in the translated listeners; "" when
// there is none.
func extProcClusterOf(listeners []*listenerv3.Listener) string {
	name := ""
	for _, l := range listeners {
		eachHCM(l, func(_ *listenerv3.Filter, hcm *hcmv3.HttpConnectionManager) bool {
			for _, hf := range hcm.GetHttpFilters() {
				if n := extProcOf(hf).GetGrpcService().GetEnvoyGrpc().GetClusterName(); n != "" {
					name = n
					return false
				}
			}
			return true
		})
		if name != "" {
			return name
		}
	}
	return ""
}

// eachHCM calls fn with every HTTP connection manager of a listener's filter chains (the default one too) and
// the network filter holding it, until fn returns false.
func eachHCM(l *listenerv3.Listener, fn func(*listenerv3.Filter, *hcmv3.HttpConnectionManager) bool) {
	chains := l.GetFilterChains()
	if d := l.GetDefaultFilterChain(); d != nil {
		chains = append(chains[:len(chains):len(chains)], d)
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(hcm) != nil {
				continue
			}
			if !fn(f, hcm) {
				return
			}
		}
	}
}

// extProcOf is an HTTP filter's ext_proc configuration, nil when it is another filter.
func extProcOf(hf *hcmv3.HttpFilter) *extprocfilterv3.ExternalProcessor {
	ep := &extprocfilterv3.ExternalProcessor{}
	if hf.GetTypedConfig() == nil || hf.GetTypedConfig().UnmarshalTo(ep) != nil {
		return nil
	}
	return ep
}

// retargetLegFilter points a fallback cluster's upstream ext_proc filter at Envoy Gateway's cluster for
// infergate (Envoy Gateway has no cluster of the name infergate's own bootstrap uses), or removes the filter
// when there is no such cluster: attempts to the managed API then go without the model rename, as they would
// with infergate unreachable.
func retargetLegFilter(c *clusterv3.Cluster, extProcCluster string) error {
	opts, err := upstreamOptions(c)
	if err != nil || opts == nil {
		return err
	}
	filters := opts.GetHttpFilters()[:0]
	for _, hf := range opts.GetHttpFilters() {
		ep := &extprocfilterv3.ExternalProcessor{}
		if hf.GetTypedConfig() == nil || hf.GetTypedConfig().UnmarshalTo(ep) != nil {
			filters = append(filters, hf)
			continue
		}
		if extProcCluster == "" {
			continue
		}
		ep.GetGrpcService().GetEnvoyGrpc().ClusterName = extProcCluster
		hf.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(ep)}
		filters = append(filters, hf)
	}
	opts.HttpFilters = filters
	c.TypedExtensionProtocolOptions[upstreamOptionsKey] = mustAny(opts)
	return nil
}
