package xds

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/manifest"
)

// The Istio EnvoyFilter's embedded filter is a valid ext_proc config that keeps the envoy.lb metadata.
func TestIstioEnvoyFilter(t *testing.T) {
	docs := manifest.DecodeAll(t, "../deploy/istio/envoyfilter.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "EnvoyFilter" {
		t.Fatalf("docs %v", docs)
	}
	patches := manifest.Get(docs[0], "spec", "configPatches").([]any)
	value := manifest.Get(patches[0], "patch", "value")
	if manifest.Get(value, "name") != "envoy.filters.http.ext_proc" || manifest.Get(patches[0], "patch", "operation") != "INSERT_BEFORE" {
		t.Fatalf("patch %v", patches[0])
	}
	js, _ := json.Marshal(manifest.Get(value, "typed_config"))
	var anyMsg map[string]any
	_ = json.Unmarshal(js, &anyMsg)
	delete(anyMsg, "@type")
	js, _ = json.Marshal(anyMsg)
	var ep extprocfilterv3.ExternalProcessor
	if err := protojson.Unmarshal(js, &ep); err != nil {
		t.Fatalf("ext_proc config: %v", err)
	}
	if err := ep.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	if ns := ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(); len(ns) != 1 || ns[0] != "envoy.lb" {
		t.Errorf("receiving namespaces %v", ns)
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
