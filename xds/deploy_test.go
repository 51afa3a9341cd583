package xds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	credinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionetworking "istio.io/api/networking/v1alpha3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/manifest"
)

// The Istio EnvoyFilter decodes into Istio's own type, and every patch's value into the Envoy type its
// applyTo names, valid: the ext_proc filter (FULL_DUPLEX_STREAMED, envoy.lb kept), and for every pool of the
// quickstart policy an override_host cluster and a route on x-infergate-pool to it; and a DestinationRule
// that makes the gateway's connection to ext_proc mutual TLS.
func TestIstioEnvoyFilter(t *testing.T) {
	docs := manifest.DecodeAll(t, "../deploy/istio/envoyfilter.yaml")
	if len(docs) != 2 || docs[0]["kind"] != "EnvoyFilter" || docs[1]["kind"] != "DestinationRule" {
		t.Fatalf("docs %v", docs)
	}
	checkIstioExtProcTLS(t, docs[1])
	spec, _ := json.Marshal(docs[0]["spec"])
	var ef istionetworking.EnvoyFilter
	if err := protojson.Unmarshal(spec, &ef); err != nil {
		t.Fatalf("not an Istio EnvoyFilter: %v", err)
	}
	clusters, routes := map[string]*clusterv3.Cluster{}, map[string]*routev3.Route{}
	var extproc *extprocfilterv3.ExternalProcessor
	for i, p := range ef.GetConfigPatches() {
		value, err := protojson.Marshal(p.GetPatch().GetValue())
		if err != nil {
			t.Fatal(err)
		}
		var msg interface {
			proto.Message
			ValidateAll() error
		}
		switch p.GetApplyTo() {
		case istionetworking.EnvoyFilter_HTTP_FILTER:
			msg = &hcmv3.HttpFilter{}
		case istionetworking.EnvoyFilter_CLUSTER:
			msg = &clusterv3.Cluster{}
		case istionetworking.EnvoyFilter_HTTP_ROUTE:
			msg = &routev3.Route{}
		default:
			t.Fatalf("patch %d: unexpected applyTo %v", i, p.GetApplyTo())
		}
		if err := protojson.Unmarshal(value, msg); err != nil {
			t.Fatalf("patch %d (%v): %v", i, p.GetApplyTo(), err)
		}
		if err := msg.ValidateAll(); err != nil {
			t.Fatalf("patch %d (%v): %v", i, p.GetApplyTo(), err)
		}
		switch m := msg.(type) {
		case *hcmv3.HttpFilter:
			extproc = &extprocfilterv3.ExternalProcessor{}
			if err := m.GetTypedConfig().UnmarshalTo(extproc); err != nil {
				t.Fatal(err)
			}
		case *clusterv3.Cluster:
			clusters[m.GetName()] = m
		case *routev3.Route:
			routes[m.GetName()] = m
		}
	}
	if extproc == nil || extproc.GetProcessingMode().GetRequestBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		extproc.GetProcessingMode().GetResponseBodyMode() != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		t.Fatalf("ext_proc filter %v: want FULL_DUPLEX_STREAMED both ways (no buffer limit on prompts)", extproc)
	}
	if ns := extproc.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(); len(ns) != 1 || ns[0] != contract.MetadataNamespace {
		t.Errorf("receiving namespaces %v", ns)
	}
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			name := contract.ClusterName(m.Name, p.Name)
			c := clusters[name]
			if c == nil {
				t.Errorf("no cluster %s", name)
				continue
			}
			var oh overridehostv3.OverrideHost
			lb := c.GetLoadBalancingPolicy().GetPolicies()
			if len(lb) != 1 || lb[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&oh) != nil ||
				oh.GetOverrideHostSources()[0].GetHeader() != contract.HeaderDestination || oh.GetSelectedHostKey() == nil {
				t.Errorf("cluster %s: no override_host policy on %s", name, contract.HeaderDestination)
			}
		}
	}
	checkIstioMatchesXDS(t, extproc, clusters, routes)
}

// checkIstioMatchesXDS holds the EnvoyFilter's managed-API path to what infergate's own xDS serves Envoy for the
// same policy: every route (a pool's, retrying on another replica with previous_hosts, to its failover aggregate;
// the fallback's), every failover aggregate and fallback cluster, equal but for what Istio names otherwise — the
// ext_proc cluster (Istio's outbound cluster for the infergate Service) and where the key comes from (infergate's
// SDS over the infergate-xds cluster, which presents the chart's client certificate from Istio's agent).
func checkIstioMatchesXDS(t *testing.T, extproc *extprocfilterv3.ExternalProcessor, clusters map[string]*clusterv3.Cluster, routes map[string]*routev3.Route) {
	t.Helper()
	t.Setenv("TOGETHER_API_KEY", "a key")
	res, err := Build(quickstart(t), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	istioExtProc := extproc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	xdsSource := &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{
		ApiConfigSource: &corev3.ApiConfigSource{ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "infergate-xds"}}}}}}}
	for _, r := range res.Clusters {
		want := proto.Clone(r.(*clusterv3.Cluster)).(*clusterv3.Cluster)
		name := want.GetName()
		if strings.HasPrefix(name, "pool/") {
			continue // STRICT_DNS on the pool's Service instead of EDS: checked above
		}
		if opts, err := upstreamOptions(want); err == nil && opts != nil {
			istioUpstream(t, opts, istioExtProc, xdsSource)
			want.TypedExtensionProtocolOptions[upstreamOptionsKey] = mustAny(opts)
		}
		got := clusters[name]
		if got == nil || !proto.Equal(normalizedAny(t, got), normalizedAny(t, want)) {
			t.Errorf("cluster %s differs from infergate's xDS:\n got  %v\n want %v", name, got, want)
		}
	}
	var want []*routev3.Route
	for _, r := range res.Routes {
		for _, vh := range r.(*routev3.RouteConfiguration).GetVirtualHosts() {
			want = append(want, vh.GetRoutes()...)
		}
	}
	for _, w := range want {
		if w.GetName() == "default" {
			continue // Istio's own routes come after infergate's
		}
		if got := routes[w.GetName()]; got == nil || !proto.Equal(got, w) {
			t.Errorf("route %s differs from infergate's xDS:\n got  %v\n want %v", w.GetName(), got, w)
		}
	}
	xds := clusters["infergate-xds"]
	var up tlsv3.UpstreamTlsContext
	if xds == nil || xds.GetTransportSocket().GetTypedConfig().UnmarshalTo(&up) != nil ||
		len(up.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()) != 1 ||
		up.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()[0].GetName() != "kubernetes://infergate-envoy-client" {
		t.Errorf("infergate-xds cluster %v: want mutual TLS with the chart's client certificate", xds)
	}
}

// istioUpstream rewrites a fallback cluster's upstream filters as the EnvoyFilter must have them.
func istioUpstream(t *testing.T, opts *upstreamhttpv3.HttpProtocolOptions, extproc string, source *corev3.ConfigSource) {
	t.Helper()
	for _, f := range opts.GetHttpFilters() {
		switch f.GetName() {
		case "envoy.filters.http.ext_proc":
			var ep extprocfilterv3.ExternalProcessor
			if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				t.Fatal(err)
			}
			ep.GetGrpcService().GetEnvoyGrpc().ClusterName = extproc
			f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&ep)}
		case "envoy.filters.http.credential_injector":
			var ci credinjectorv3.CredentialInjector
			var g genericv3.Generic
			if err := f.GetTypedConfig().UnmarshalTo(&ci); err != nil || ci.GetCredential().GetTypedConfig().UnmarshalTo(&g) != nil {
				t.Fatal(err)
			}
			g.GetCredential().SdsConfig = source
			ci.GetCredential().TypedConfig = mustAny(&g)
			f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&ci)}
		}
	}
}

// normalizedAny re-encodes a cluster so that the Any values inside it compare by content (YAML-decoded and
// built messages may serialise their fields in another order).
func normalizedAny(t *testing.T, c *clusterv3.Cluster) *clusterv3.Cluster {
	t.Helper()
	b, err := protojson.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var out clusterv3.Cluster
	if err := protojson.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// checkIstioExtProcTLS decodes the DestinationRule into Istio's type: the ingress gateway's connection to
// ext_proc's port presents the chart's Envoy client certificate and checks infergate's server name.
func checkIstioExtProcTLS(t *testing.T, doc map[string]any) {
	t.Helper()
	spec, _ := json.Marshal(doc["spec"])
	var dr istionetworking.DestinationRule
	if err := protojson.Unmarshal(spec, &dr); err != nil {
		t.Fatalf("not an Istio DestinationRule: %v", err)
	}
	if dr.GetHost() != "infergate.infergate.svc.cluster.local" || dr.GetWorkloadSelector().GetMatchLabels()["istio"] != "ingressgateway" {
		t.Errorf("destination rule for %s on %v", dr.GetHost(), dr.GetWorkloadSelector())
	}
	ports := dr.GetTrafficPolicy().GetPortLevelSettings()
	if len(ports) != 1 || ports[0].GetPort().GetNumber() != 9002 {
		t.Fatalf("port settings %v: want ext_proc's 9002", ports)
	}
	tls := ports[0].GetTls()
	if tls.GetMode() != istionetworking.ClientTLSSettings_MUTUAL || tls.GetCredentialName() != "infergate-envoy-client" || tls.GetSni() != dr.GetHost() {
		t.Errorf("ext_proc TLS %v: want MUTUAL with the chart's client certificate", tls)
	}
}

// The Kubernetes manifests: the ConfigMap's policy is valid, probes ask infergate's gRPC health services, the
// Service exposes the three ports, and the PDB keeps replicas during drains.
func TestKubernetesManifests(t *testing.T) {
	docs := manifest.DecodeAll(t, "../deploy/kubernetes/infergate.yaml")
	kinds := map[string]map[string]any{}
	for _, d := range docs {
		kinds[d["kind"].(string)] = d
	}
	for _, k := range []string{"Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} {
		if kinds[k] == nil {
			t.Errorf("no %s", k)
		}
	}
	policy := manifest.Get(kinds["ConfigMap"], "data", "policy.yaml").(string)
	if _, err := policies.Parse("configmap/policy.yaml", []byte(policy)); err != nil {
		t.Errorf("the ConfigMap's policy is invalid: %v", err)
	}
	container := manifest.Get(kinds["Deployment"], "spec", "template", "spec", "containers").([]any)[0]
	// kubelet's gRPC probes cannot speak TLS: the probes ask serve's HTTP health paths on the metrics port.
	for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		if got := manifest.Get(container, probe, "httpGet", "path"); got != path {
			t.Errorf("%s asks %v, want %s", probe, got, path)
		}
		if got := manifest.Get(container, probe, "httpGet", "port"); got != "metrics" {
			t.Errorf("%s on port %v", probe, got)
		}
	}
	// Beyond loopback every gRPC port is mutual TLS, from the mounted Secret.
	args := fmt.Sprint(manifest.Get(container, "args"))
	for _, flag := range []string{"--tls-cert", "--tls-key", "--tls-client-ca", "--xds-secret-nodes"} {
		if !strings.Contains(args, flag) {
			t.Errorf("the Deployment does not set %s", flag)
		}
	}
	// ext_proc, xDS, metrics and the Envoy Gateway hook, each a port the container declares.
	declared := map[string]bool{}
	for _, c := range manifest.Get(kinds["Deployment"], "spec", "template", "spec", "containers").([]any) {
		for _, p := range manifest.Get(c, "ports").([]any) {
			declared[manifest.Get(p, "name").(string)] = true
		}
	}
	if ports := manifest.Get(kinds["Service"], "spec", "ports").([]any); len(ports) != 4 {
		t.Errorf("service ports %d, want 4", len(ports))
	} else {
		for _, p := range ports {
			if target, _ := manifest.Get(p, "targetPort").(string); !declared[target] {
				t.Errorf("service port %v targets %q, which the container does not declare", manifest.Get(p, "name"), target)
			}
		}
	}
	if manifest.Get(kinds["PodDisruptionBudget"], "spec", "minAvailable") == nil {
		t.Error("PDB without minAvailable")
	}
}
