package xds

import (
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

const regionalPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  regions:
  - {name: us-east, rtt: {us-west: 60ms, eu-west: 80ms}}
  - {name: us-west, rtt: {eu-west: 140ms}}
  - {name: eu-west}
  hardwareClasses:
    l40s: {costPerHour: 1.1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  tiers:
    pro: {}
    eu: {residency: [eu-west]}
  models:
  - name: m
    pools:
    - {name: east, hardwareClass: l40s, engine: vllm, region: us-east, endpoints: ["10.0.0.1:1"]}
    - {name: west, hardwareClass: l40s, engine: vllm, region: us-west, endpoints: ["10.0.1.1:1"]}
    - {name: eu, hardwareClass: l40s, engine: vllm, region: eu-west, endpoints: ["10.0.2.1:1"]}
    fallbacks:
    - {name: together, baseURL: "https://api.together.xyz/v1", model: provider-m, apiKeyFrom: "env:K", when: [unavailable]}
  tenants:
  - {name: acme, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
  - {name: bank, tier: eu, apiKeys: ["sha256:bbb8fab5ab2c83254e4969c119cdbb68880ee066c42a36223f8ac83fff2d5b96"], models: ["*"]}
`

func regionalSnap(t *testing.T, edit func(string) string) *policies.Snapshot {
	t.Helper()
	src := regionalPolicy
	if edit != nil {
		src = edit(src)
	}
	snap, err := policies.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// children is an aggregate cluster's children, nil when the name is not an aggregate of res.
func children(t *testing.T, res *Resources, name string) []string {
	t.Helper()
	for _, r := range res.Clusters {
		c := r.(*clusterv3.Cluster)
		if c.GetName() != name || c.GetClusterType() == nil {
			continue
		}
		agg := &aggregatev3.ClusterConfig{}
		if err := c.GetClusterType().GetTypedConfig().UnmarshalTo(agg); err != nil {
			t.Fatal(err)
		}
		return agg.GetClusters()
	}
	return nil
}

// routeTo is the cluster the route matching these headers sends to (the first that matches, as Envoy takes
// them), "" when none does.
func routeTo(res *Resources, headers map[string]string) string {
	for _, r := range res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes() {
		ok := true
		for _, h := range r.GetMatch().GetHeaders() {
			ok = ok && headers[h.GetName()] == h.GetStringMatch().GetExact()
		}
		if ok {
			return r.GetRoute().GetCluster()
		}
	}
	return ""
}

// A pool fails over inside Envoy to the next regions' pools in the gateway's order, then the managed API; a
// pinned tenant's request, which carries its residency, to neither outside it. Every pool's endpoints are a
// locality of its region.
func TestPoolsFailOverAcrossRegionsInsideEnvoy(t *testing.T) {
	snap := regionalSnap(t, nil)
	pool := func(name string) string { return contract.ClusterName("m", name) }
	together := contract.FallbackClusterName("m", "together")
	for _, tc := range []struct {
		region  string
		headers map[string]string
		want    []string // the route's aggregate, in priority order; one name: the pool's cluster itself
	}{
		{"us-east", map[string]string{contract.HeaderPool: "east"}, []string{pool("east"), pool("west"), pool("eu"), together}},
		{"us-east", map[string]string{contract.HeaderPool: "west"}, []string{pool("west"), pool("eu"), together}},
		{"us-west", map[string]string{contract.HeaderPool: "west"}, []string{pool("west"), pool("east"), pool("eu"), together}},
		{"eu-west", map[string]string{contract.HeaderPool: "eu"}, []string{pool("eu"), pool("east"), pool("west"), together}},
		{"", map[string]string{contract.HeaderPool: "east"}, []string{pool("east"), together}},
		{"us-east", map[string]string{contract.HeaderPool: "eu", contract.HeaderResidency: "eu-west"}, []string{pool("eu")}},
		{"us-east", map[string]string{contract.HeaderPool: "eu"}, []string{pool("eu"), together}},
	} {
		res, err := BuildInRegion(snap, nil, nil, tc.region)
		if err != nil {
			t.Fatal(err)
		}
		target := routeTo(res, tc.headers)
		got := children(t, res, target)
		if got == nil {
			got = []string{target}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("from %q, %v: fails over through %v, want %v", tc.region, tc.headers, got, tc.want)
		}
	}
	// The retries of a route whose chain crosses regions leave a failing pool after two attempts (the retry
	// priority); a chain of the pool and the managed API alone keeps them in the pool.
	for region, want := range map[string]string{"us-east": "envoy.retry_priorities.previous_priorities", "": ""} {
		res, err := BuildInRegion(snap, nil, nil, region)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Routes[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes() {
			if r.GetName() == contract.ClusterName("m", "east") {
				if got := r.GetRoute().GetRetryPolicy().GetRetryPriority().GetName(); got != want {
					t.Errorf("from %q: the east route's retry priority %q, want %q", region, got, want)
				}
			}
		}
	}
	// A pool that serves the model under another name cannot take a body rewritten for this one.
	renamed, err := BuildInRegion(regionalSnap(t, func(s string) string {
		return strings.Replace(s, "region: us-west, endpoints", "region: us-west, servedModel: other-name, endpoints", 1)
	}), nil, nil, "us-east")
	if err != nil {
		t.Fatal(err)
	}
	if got := children(t, renamed, routeTo(renamed, map[string]string{contract.HeaderPool: "east"})); !slices.Equal(got, []string{pool("east"), pool("eu"), together}) {
		t.Errorf("a pool under another served name is in the chain: %v", got)
	}
	// A managed API inside the residency takes the pinned tenant's overflow too.
	res, err := BuildInRegion(regionalSnap(t, func(s string) string {
		return strings.Replace(s, "when: [unavailable]}", "when: [unavailable], region: eu-west}", 1)
	}), nil, nil, "us-east")
	if err != nil {
		t.Fatal(err)
	}
	target := routeTo(res, map[string]string{contract.HeaderPool: "eu", contract.HeaderResidency: "eu-west"})
	if got := children(t, res, target); !slices.Equal(got, []string{pool("eu"), together}) {
		t.Errorf("pinned tenant with a resident managed API: %v", got)
	}
	for _, r := range res.Endpoints {
		cla := r.(*endpointv3.ClusterLoadAssignment)
		want := map[string]string{pool("east"): "us-east", pool("west"): "us-west", pool("eu"): "eu-west"}[cla.GetClusterName()]
		if got := cla.GetEndpoints()[0].GetLocality().GetRegion(); got != want {
			t.Errorf("%s: locality region %q, want %q", cla.GetClusterName(), got, want)
		}
	}
}

// Proxyless gRPC clients are weighted over the nearest region with capacity: the gateway's own while it has
// some, the next when it has none.
func TestProxylessClientsPreferTheirRegion(t *testing.T) {
	snap := regionalSnap(t, nil)
	for _, tc := range []struct {
		fleet fakeFleet
		want  string
	}{
		{nil, "east"},
		{fakeFleet{"10.0.0.1:1": {Healthy: false}}, "west"},
		{fakeFleet{"10.0.0.1:1": {Healthy: false}, "10.0.1.1:1": {Healthy: false}}, "eu"},
	} {
		res, _, err := buildGRPC(snap, tc.fleet, nil, "us-east")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range res.Routes {
			rc := r.(*routev3.RouteConfiguration)
			for _, w := range rc.GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetWeightedClusters().GetClusters() {
				got = append(got, w.GetName())
			}
		}
		if !slices.Equal(got, []string{contract.ClusterName("m", tc.want)}) {
			t.Errorf("fleet %v: weighted %v, want only pool %s", tc.fleet, got, tc.want)
		}
	}
}
