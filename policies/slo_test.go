package policies

import (
	"testing"
	"time"
)

func TestSLOResolution(t *testing.T) {
	snap, err := LoadFile("testdata/valid/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tenant := func(name string) *Tenant { return tenantNamed(t, snap, name) }
	model := func(name string) *Model {
		m, ok := snap.Model(name)
		if !ok {
			t.Fatalf("no model %s", name)
		}
		return m
	}
	ms := time.Millisecond
	cases := []struct {
		tenant, model string
		want          Targets
	}{
		{"acme", "qwen2.5-7b", Targets{TTFT: 200 * ms, TPOT: 30 * ms, Objective: 0.99, Set: true}},
		{"acme", "llama-70b", Targets{TTFT: 500 * ms, TPOT: 50 * ms, Objective: 0.99, Set: true}}, // the model override, by alias
		{"globex", "llama-3.3-70b", Targets{TTFT: 500 * ms, TPOT: 50 * ms, Objective: 0.99, Set: true}},
		{"initech", "qwen-7b", Targets{TTFT: 2 * time.Second, TPOT: 100 * ms, Objective: 0.95, Set: true}}, // spec.slo
	}
	for _, c := range cases {
		if got := snap.SLO(tenant(c.tenant), model(c.model)); got != c.want {
			t.Errorf("SLO(%s, %s) = %+v, want %+v", c.tenant, c.model, got, c.want)
		}
	}
	if got := len(snap.SLOTable()); got != 3*2 {
		t.Errorf("SLOTable has %d entries, want 6 (3 tiers × 2 models)", got)
	}
	if tb := snap.SLOTable(); tb[0].Tier != "enterprise" || tb[len(tb)-1].Tier != "pro" {
		t.Errorf("SLOTable not sorted by tier: first %s, last %s", tb[0].Tier, tb[len(tb)-1].Tier)
	}
}

func TestNoSLOMeansUnconstrained(t *testing.T) {
	snap, err := Parse("mem.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}}
  models:
  - name: m
    pools: [{name: a, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.1:8000"]}]
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	if got := snap.SLO(&snap.Policy.Spec.Tenants[0], m); got.Set || got.TTFT != 0 {
		t.Errorf("SLO without any slo = %+v, want unset", got)
	}
	if TierOf(&snap.Policy.Spec.Tenants[0]) != NoTier || len(snap.SLOTable()) != 0 {
		t.Errorf("tier %q, table %v", TierOf(&snap.Policy.Spec.Tenants[0]), snap.SLOTable())
	}
}

func TestAuditRetention(t *testing.T) {
	snap, err := LoadFile("testdata/valid/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]time.Duration{"acme": 2160 * time.Hour, "globex": 720 * time.Hour, "": 720 * time.Hour} {
		if got := snap.AuditRetention(tenant); got != want {
			t.Errorf("AuditRetention(%q) = %v, want %v", tenant, got, want)
		}
	}
}

// tenantNamed finds a tenant of a snapshot by name.
func tenantNamed(t *testing.T, snap *Snapshot, name string) *Tenant {
	t.Helper()
	for i := range snap.Policy.Spec.Tenants {
		if snap.Policy.Spec.Tenants[i].Name == name {
			return &snap.Policy.Spec.Tenants[i]
		}
	}
	t.Fatalf("no tenant %s", name)
	return nil
}
