package policies

import (
	"slices"
	"testing"
)

const adapterPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}}
  models:
  - name: llama
    aliases: [llama-8b]
    adapters: [llama-sql, llama-legal]
    pools: [{name: a, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.1:8000"]}]
  tenants:
  - {name: base, apiKeys: ["sha256:1111111111111111111111111111111111111111111111111111111111111111"], models: [llama-8b]}
  - {name: sql, apiKeys: ["sha256:2222222222222222222222222222222222222222222222222222222222222222"], models: [llama-sql]}
  - {name: all, apiKeys: ["sha256:3333333333333333333333333333333333333333333333333333333333333333"], models: ["*"]}
`

// Adapters are granted one by one, like models: the base model grants none of them, an adapter grants neither
// the base model nor its sibling adapters, "*" grants all; /v1/models lists exactly what may be called.
func TestAdaptersAreAllowedPerTenant(t *testing.T) {
	snap, err := Parse("adapters.yaml", []byte(adapterPolicy))
	if err != nil {
		t.Fatal(err)
	}
	tenant := func(name string) *Tenant { return tenantNamed(t, snap, name) }
	cases := []struct {
		tenant string
		allow  map[string]bool
		names  []string
	}{
		{"base", map[string]bool{"llama": true, "llama-8b": true, "llama-sql": false, "llama-legal": false}, []string{"llama", "llama-8b"}},
		{"sql", map[string]bool{"llama": false, "llama-8b": false, "llama-sql": true, "llama-legal": false}, []string{"llama-sql"}},
		{"all", map[string]bool{"llama": true, "llama-8b": true, "llama-sql": true, "llama-legal": true},
			[]string{"llama", "llama-8b", "llama-sql", "llama-legal"}},
	}
	for _, c := range cases {
		tn := tenant(c.tenant)
		for name, want := range c.allow {
			if got := snap.AllowsName(tn, name); got != want {
				t.Errorf("AllowsName(%s, %s) = %v, want %v", c.tenant, name, got, want)
			}
		}
		if got := snap.NamesFor(tn); !slices.Equal(got, c.names) {
			t.Errorf("NamesFor(%s) = %v, want %v", c.tenant, got, c.names)
		}
	}
	if snap.AllowsName(tenant("all"), "nope") {
		t.Error("an unknown name is allowed")
	}
}
