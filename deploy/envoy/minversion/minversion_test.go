// Package minversion decodes every Envoy configuration infergate ships or serves with the API of the oldest
// Envoy it supports (go-control-plane's envoy module at that release, pinned in this module's go.mod): a
// field that Envoy release does not know fails the decode. The main module's TestMinimumEnvoyIsStated keeps
// that pin, the README and deploy/compose's image on the same version.
package minversion

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	// Every extension the configurations name in a typed_config.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/upstream_codec/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// toJSON turns YAML into JSON for protojson (yaml.v3 decodes mappings with string keys into map[string]any).
func toJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t *testing.T, where string, js []byte, into proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(js, into); err != nil {
		t.Errorf("%s does not decode with the minimum Envoy's API: %v", where, err)
	}
}

// The shipped bootstraps.
func TestShippedBootstraps(t *testing.T) {
	files, _ := filepath.Glob("../*.yaml")
	if len(files) < 3 {
		t.Fatalf("bootstraps: %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		decode(t, f, toJSON(t, doc), &bootstrapv3.Bootstrap{})
	}
}

// The Istio EnvoyFilter's patches: the filter, the pool clusters and their routes.
func TestIstioPatches(t *testing.T) {
	b, err := os.ReadFile("../../istio/envoyfilter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			ConfigPatches []struct {
				ApplyTo string `yaml:"applyTo"`
				Patch   struct {
					Value any `yaml:"value"`
				} `yaml:"patch"`
			} `yaml:"configPatches"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for i, p := range doc.Spec.ConfigPatches {
		var msg proto.Message
		switch p.ApplyTo {
		case "HTTP_FILTER":
			msg = &hcmv3.HttpFilter{}
		case "CLUSTER":
			msg = &clusterv3.Cluster{}
		case "HTTP_ROUTE":
			msg = &routev3.Route{}
		default:
			t.Fatalf("patch %d: applyTo %s", i, p.ApplyTo)
		}
		decode(t, fmt.Sprintf("istio patch %d (%s)", i, p.ApplyTo), toJSON(t, p.Patch.Value), msg)
	}
}

// The resources infergate's control plane serves, as its golden files record them (go test ./xds -update).
func TestServedResources(t *testing.T) {
	for file, newMsg := range map[string]func() proto.Message{
		"quickstart.clusters.yaml":  func() proto.Message { return &clusterv3.Cluster{} },
		"quickstart.endpoints.yaml": func() proto.Message { return &endpointv3.ClusterLoadAssignment{} },
		"quickstart.routes.yaml":    func() proto.Message { return &routev3.RouteConfiguration{} },
		"regions.clusters.yaml":     func() proto.Message { return &clusterv3.Cluster{} },
		"regions.endpoints.yaml":    func() proto.Message { return &endpointv3.ClusterLoadAssignment{} },
		"regions.routes.yaml":       func() proto.Message { return &routev3.RouteConfiguration{} },
	} {
		b, err := os.ReadFile(filepath.Join("../../../xds/testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		var docs []any
		if err := yaml.Unmarshal(b, &docs); err != nil {
			t.Fatal(err)
		}
		if len(docs) == 0 {
			t.Fatalf("%s: no resources", file)
		}
		for i, d := range docs {
			decode(t, fmt.Sprintf("%s[%d]", file, i), toJSON(t, d), newMsg())
		}
	}
}
