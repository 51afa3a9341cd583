package policies

import (
	"maps"
	"reflect"
	"strings"
	"testing"
)

// Defaults are applied once, to the document: the snapshot's accessors and the document it holds read the same
// resolved values, and no older weight field survives to be read by mistake.
func TestDefaultsAreAppliedOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		routing string
		weights map[string]float64
	}{
		{"nothing stated", "", map[string]float64{"prefix": 2, "load": 1, "prefill": 1, "lora": 1}},
		{"weights by name", "  routing: {weights: {load: 0.5}}\n", map[string]float64{"prefix": 2, "load": 0.5, "prefill": 1, "lora": 1}},
		{"older fields", "  routing: {loadWeight: 3, prefillWeight: 0}\n", map[string]float64{"prefix": 0, "load": 3, "prefill": 0, "lora": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := Parse("p.yaml", []byte(minimalPolicy(tc.routing)))
			if err != nil {
				t.Fatal(err)
			}
			spec := snap.Policy.Spec
			if !reflect.DeepEqual(spec.Routing, snap.Routing()) || spec.Quotas != snap.QuotaSettings() || spec.Gateway != snap.Gateway() {
				t.Errorf("the document and the snapshot disagree:\n%+v\n%+v", spec.Routing, snap.Routing())
			}
			r := snap.Routing()
			if !maps.Equal(r.Weights, tc.weights) {
				t.Errorf("weights %v, want %v", r.Weights, tc.weights)
			}
			if r.PrefixWeight != 0 || r.LoadWeight != 0 || r.PrefillWeight != nil || r.LoRAWeight != nil {
				t.Errorf("an older weight field survived: %+v", r)
			}
			if r.MaxWaiting != DefaultMaxWaiting || r.Placement != PlacementSLO || spec.Quotas.FailMode != FailOpen ||
				spec.Gateway.DefaultMaxTokens != DefaultMaxTokens || spec.Models[0].ContextTokens != DefaultContextTokens ||
				spec.Models[0].Pools[0].ServedModel != "m" {
				t.Errorf("a default is missing: %+v %+v %+v", r, spec.Gateway, spec.Models[0])
			}
		})
	}
}

func minimalPolicy(routing string) string {
	return strings.Join([]string{
		"apiVersion: infergate.io/v1alpha1",
		"kind: Policy",
		"spec:",
		strings.TrimSuffix(routing, "\n"),
		"  hardwareClasses: {l40s: {costPerHour: 1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}}",
		"  models:",
		"  - {name: m, pools: [{name: p, hardwareClass: l40s, engine: vllm, endpoints: [\"10.0.0.1:1\"]}]}",
		"  tenants:",
		"  - {name: t, apiKeys: [\"sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13\"], models: [\"*\"]}",
	}, "\n") + "\n"
}
