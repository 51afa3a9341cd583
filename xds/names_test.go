package xds

import (
	"testing"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/envoysim"
)

// The shipped Envoy configuration must name one cluster per quickstart pool, with exactly the pool's
// endpoints, and route the pool and model headers to them.
func TestShippedEnvoyConfigMatchesPolicy(t *testing.T) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"../deploy/envoy/envoy.yaml", "../deploy/envoy/envoy-buffered.yaml"} {
		cfg, err := envoysim.LoadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := cfg.Clusters[ExtProcClusterName]; !ok {
			t.Errorf("%s: no %s cluster", file, ExtProcClusterName)
		}
		if cfg.Routes.GetName() != RouteConfigName {
			t.Errorf("%s: route config %q, want %q", file, cfg.Routes.GetName(), RouteConfigName)
		}
		for _, m := range snap.Policy.Spec.Models {
			for _, p := range m.Pools {
				c, ok := cfg.Clusters[contract.ClusterName(m.Name, p.Name)]
				if !ok {
					t.Errorf("%s: cluster %s missing", file, contract.ClusterName(m.Name, p.Name))
					continue
				}
				if len(c.Endpoints) != len(p.Endpoints) {
					t.Errorf("%s: %s has %v, policy says %v", file, c.Name, c.Endpoints, p.Endpoints)
				}
				for i := range p.Endpoints {
					if i < len(c.Endpoints) && c.Endpoints[i] != p.Endpoints[i] {
						t.Errorf("%s: %s endpoint %d is %s, policy says %s", file, c.Name, i, c.Endpoints[i], p.Endpoints[i])
					}
				}
			}
		}
	}
}
