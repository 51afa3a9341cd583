package xds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
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
			r := routes[name]
			if r == nil || r.GetRoute().GetCluster() != name || len(r.GetMatch().GetHeaders()) != 1 ||
				r.GetMatch().GetHeaders()[0].GetName() != contract.HeaderPool || r.GetMatch().GetHeaders()[0].GetStringMatch().GetExact() != p.Name {
				t.Errorf("no route on %s: %s to %s: %v", contract.HeaderPool, p.Name, name, r)
			}
		}
	}
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
