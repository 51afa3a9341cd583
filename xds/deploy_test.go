package xds

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/policies"
)

func decodeAll(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, d)
	}
	return docs
}

func get(m any, path ...string) any {
	for _, k := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[k]
	}
	return m
}

// The Istio EnvoyFilter's embedded filter is a valid ext_proc config that keeps the envoy.lb metadata.
func TestIstioEnvoyFilter(t *testing.T) {
	docs := decodeAll(t, "../deploy/istio/envoyfilter.yaml")
	if len(docs) != 1 || docs[0]["kind"] != "EnvoyFilter" {
		t.Fatalf("docs %v", docs)
	}
	patches := get(docs[0], "spec", "configPatches").([]any)
	value := get(patches[0], "patch", "value")
	if get(value, "name") != "envoy.filters.http.ext_proc" || get(patches[0], "patch", "operation") != "INSERT_BEFORE" {
		t.Fatalf("patch %v", patches[0])
	}
	js, _ := json.Marshal(get(value, "typed_config"))
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
	docs := decodeAll(t, "../deploy/kubernetes/infergate.yaml")
	kinds := map[string]map[string]any{}
	for _, d := range docs {
		kinds[d["kind"].(string)] = d
	}
	for _, k := range []string{"Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} {
		if kinds[k] == nil {
			t.Errorf("no %s", k)
		}
	}
	policy := get(kinds["ConfigMap"], "data", "policy.yaml").(string)
	if _, err := policies.Parse("configmap/policy.yaml", []byte(policy)); err != nil {
		t.Errorf("the ConfigMap's policy is invalid: %v", err)
	}
	container := get(kinds["Deployment"], "spec", "template", "spec", "containers").([]any)[0]
	for probe, service := range map[string]string{"readinessProbe": "readiness", "livenessProbe": "liveness"} {
		got := get(container, probe, "grpc", "service")
		if got != service {
			t.Errorf("%s asks %v", probe, got)
		}
		found := false
		for _, s := range extproc.HealthServices {
			found = found || s == service
		}
		if !found {
			t.Errorf("%s is not a health service infergate serves", service)
		}
	}
	// ext_proc, xDS, metrics and the Envoy Gateway hook, each a port the container declares.
	declared := map[string]bool{}
	for _, c := range get(kinds["Deployment"], "spec", "template", "spec", "containers").([]any) {
		for _, p := range get(c, "ports").([]any) {
			declared[get(p, "name").(string)] = true
		}
	}
	if ports := get(kinds["Service"], "spec", "ports").([]any); len(ports) != 4 {
		t.Errorf("service ports %d, want 4", len(ports))
	} else {
		for _, p := range ports {
			if target, _ := get(p, "targetPort").(string); !declared[target] {
				t.Errorf("service port %v targets %q, which the container does not declare", get(p, "name"), target)
			}
		}
	}
	if get(kinds["PodDisruptionBudget"], "spec", "minAvailable") == nil {
		t.Error("PDB without minAvailable")
	}
}
