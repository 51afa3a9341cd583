package xds

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	pb "github.com/envoyproxy/gateway/proto/extension"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/policies"
)

// strictDecode turns one YAML document (as decodeAll reads it) into an API type, refusing unknown fields.
func strictDecode(t *testing.T, doc map[string]any, into any) {
	t.Helper()
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s %v: %v", doc["kind"], get(doc, "metadata", "name"), err)
	}
}

// Every document of deploy/envoy-gateway decodes into Envoy Gateway's and the Gateway API's own types, and
// they agree with each other, with the quickstart policy and with infergate's Kubernetes Service.
func TestEnvoyGatewayManifests(t *testing.T) {
	var (
		eg     egv1a1.EnvoyGateway
		gw     gwapiv1.Gateway
		policy egv1a1.EnvoyExtensionPolicy
		be     egv1a1.Backend
		route  gwapiv1.HTTPRoute
	)
	into := map[string]any{"EnvoyGateway": &eg, "Gateway": &gw, "EnvoyExtensionPolicy": &policy, "Backend": &be, "HTTPRoute": &route}
	seen := map[string]bool{}
	for _, doc := range decodeAll(t, "../deploy/envoy-gateway/infergate.yaml") {
		kind, _ := doc["kind"].(string)
		target, ok := into[kind]
		if !ok {
			t.Fatalf("unexpected kind %q", kind)
		}
		strictDecode(t, doc, target)
		seen[kind] = true
	}
	if len(seen) != len(into) {
		t.Fatalf("kinds decoded: %v", seen)
	}

	// The extension manager calls infergate's hook after translation, with everything it translated.
	em := eg.ExtensionManager
	if em == nil || em.Hooks == nil || em.Hooks.XDSTranslator == nil || !slices.Contains(em.Hooks.XDSTranslator.Post, egv1a1.XDSTranslation) {
		t.Fatal("extensionManager must hook the post-translation step")
	}
	tr := em.Hooks.XDSTranslator.Translation
	for name, c := range map[string]*bool{"cluster": tr.Cluster.IncludeAll, "route": tr.Route.IncludeAll, "secret": tr.Secret.IncludeAll} {
		if c == nil || !*c {
			t.Errorf("translation.%s.includeAll must be true: the hook edits them", name)
		}
	}
	hookPort := strings.TrimPrefix(EnvoyGatewayHookAddr, ":")
	if em.Service == nil || em.Service.FQDN == nil || strconv.Itoa(int(em.Service.FQDN.Port)) != hookPort {
		t.Errorf("extension service %+v, want port %s", em.Service, hookPort)
	}

	// The ext_proc policy: on the Gateway, to infergate's ext_proc port, full-duplex, envoy.lb writable.
	if len(policy.Spec.TargetRefs) != 1 || string(policy.Spec.TargetRefs[0].Name) != gw.Name || policy.Spec.TargetRefs[0].Kind != "Gateway" {
		t.Errorf("policy targets %+v, want Gateway %s", policy.Spec.TargetRefs, gw.Name)
	}
	if len(policy.Spec.ExtProc) != 1 {
		t.Fatalf("extProc %+v", policy.Spec.ExtProc)
	}
	ep := policy.Spec.ExtProc[0]
	ref := ep.BackendRefs[0]
	if ref.Name != "infergate" || ref.Port == nil || *ref.Port != 9002 {
		t.Errorf("ext_proc backend %+v, want the infergate Service on 9002", ref)
	}
	if ep.ProcessingMode == nil || *ep.ProcessingMode.Request.Body != egv1a1.FullDuplexStreamedExtBodyProcessingMode ||
		*ep.ProcessingMode.Response.Body != egv1a1.FullDuplexStreamedExtBodyProcessingMode {
		t.Errorf("processing mode %+v", ep.ProcessingMode)
	}
	if ep.Metadata == nil || !slices.Contains(ep.Metadata.WritableNamespaces, "envoy.lb") {
		t.Error("infergate must be allowed to write the envoy.lb metadata (x-gateway-destination-endpoint)")
	}

	// infergate's Service exposes both ports.
	ports := map[float64]bool{}
	for _, doc := range decodeAll(t, "../deploy/kubernetes/infergate.yaml") {
		if doc["kind"] == "Service" {
			for _, p := range get(doc, "spec", "ports").([]any) {
				ports[float64(p.(map[string]any)["port"].(int))] = true
			}
		}
	}
	for _, p := range []float64{9002, 18002} {
		if !ports[p] {
			t.Errorf("the infergate Service lacks port %v", p)
		}
	}

	// The HTTPRoute hangs on the Gateway and has a rule for every pool and fallback of the policy.
	if len(route.Spec.ParentRefs) != 1 || string(route.Spec.ParentRefs[0].Name) != gw.Name {
		t.Errorf("HTTPRoute parents %+v", route.Spec.ParentRefs)
	}
	snap := quickstart(t)
	covered := map[string]bool{}
	for _, rule := range route.Spec.Rules {
		for _, m := range rule.Matches {
			rm := &routev3.RouteMatch{}
			for _, h := range m.Headers {
				rm.Headers = append(rm.Headers, exactHeader(string(h.Name), h.Value))
			}
			name := poolClusterFor(snap, rm)
			if name == "" {
				t.Errorf("rule %+v matches no pool of the policy", m)
			}
			covered[name] = true
		}
		if len(rule.BackendRefs) != 1 || string(rule.BackendRefs[0].Name) != be.Name {
			t.Errorf("rule backends %+v, want the %s placeholder", rule.BackendRefs, be.Name)
		}
	}
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			if !covered[ClusterName(m.Name, p.Name)] {
				t.Errorf("no HTTPRoute rule for pool %s", p.Name)
			}
		}
		for _, f := range m.Fallbacks {
			if !covered[FallbackClusterName(m.Name, f.Name)] {
				t.Errorf("no HTTPRoute rule for fallback %s", f.Name)
			}
		}
	}
}

func exactHeader(name, value string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: value}}}}
}

// The hook, called over gRPC as Envoy Gateway calls it: infergate's clusters and secrets are added, the pool
// rules' routes point at them, and everything Envoy Gateway translated itself passes through.
func TestEnvoyGatewayHook(t *testing.T) {
	t.Setenv("TOGETHER_API_KEY", providerKey)
	snap := quickstart(t)
	gs := grpc.NewServer()
	pb.RegisterEnvoyGatewayExtensionServer(gs, &EnvoyGatewayHook{Policy: func() *policies.Snapshot { return snap }})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	placeholder := "httproute/infergate/llm/rule/0"
	route := func(name string, headers ...*routev3.HeaderMatcher) *routev3.Route {
		return &routev3.Route{Name: name, Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: headers},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: placeholder}}}}
	}
	req := &pb.PostTranslateModifyRequest{
		Clusters:  []*clusterv3.Cluster{{Name: placeholder}, {Name: "eg-own"}},
		Secrets:   []*tlsv3.Secret{{Name: "eg-cert"}},
		Listeners: []*listenerv3.Listener{{Name: "infergate/llm-gateway/http"}},
		Routes: []*routev3.RouteConfiguration{{Name: "infergate/llm-gateway/http", VirtualHosts: []*routev3.VirtualHost{{
			Name: "llm", Domains: []string{"*"}, Routes: []*routev3.Route{
				route("h200", exactHeader("x-infergate-pool", "llama70b-h200")),
				route("overflow", exactHeader("x-infergate-pool", "fallback/together")),
				route("other"),
			}}}}},
	}
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
	pool := clusters[ClusterName("llama-3.3-70b", "llama70b-h200")]
	if pool == nil || pool.GetType() != clusterv3.Cluster_STATIC || len(pool.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()) != 2 {
		t.Fatalf("pool cluster %v: want STATIC with its two endpoints inline", pool)
	}
	fb := clusters[FallbackClusterName("llama-3.3-70b", "together")]
	if fb == nil || len(secretRefs(fb)) != 1 {
		t.Fatalf("fallback cluster %v: want its credential injector", fb)
	}
	if clusters[placeholder] == nil || clusters["eg-own"] == nil || len(resp.GetListeners()) != 1 {
		t.Error("Envoy Gateway's own clusters and listeners must pass through")
	}
	secrets := map[string]bool{}
	for _, s := range resp.GetSecrets() {
		secrets[s.GetName()] = true
	}
	if !secrets["eg-cert"] || !secrets[SecretName("llama-3.3-70b", "together")] {
		t.Errorf("secrets %v", secrets)
	}
	got := map[string]string{}
	for _, r := range resp.GetRoutes()[0].GetVirtualHosts()[0].GetRoutes() {
		got[r.GetName()] = r.GetRoute().GetCluster()
	}
	want := map[string]string{"h200": ClusterName("llama-3.3-70b", "llama70b-h200"),
		"overflow": FallbackClusterName("llama-3.3-70b", "together"), "other": placeholder}
	for name, c := range want {
		if got[name] != c {
			t.Errorf("route %s → %s, want %s", name, got[name], c)
		}
	}
	if req.GetRoutes()[0].GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster() != placeholder {
		t.Error("the hook modified its input in place")
	}
}
