package policies

import (
	"testing"
	"time"
)

func TestAdmissionSettings(t *testing.T) {
	src := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  admission: {maxQueueWait: 3s}
  hardwareClasses: {h: {prefillTokensPerSecond: 1000, decodeTokensPerSecond: 100}}
  tiers:
    gold: {priority: 10, maxQueueWait: 800ms, degradeTo: [{model: big-alias, to: small}]}
    tin: {headroom: 0.5, minShare: 0.1, maxQueueWait: 10s}
  models:
  - {name: big, aliases: [big-alias], pools: [{name: a, hardwareClass: h, engine: vllm, endpoints: ["10.0.0.1:1"]}]}
  - {name: small, pools: [{name: b, hardwareClass: h, engine: vllm, endpoints: ["10.0.0.2:1"]}]}
  tenants:
  - {name: g, tier: gold, queueWeight: 3, apiKeys: ["sha256:` + zeros(1) + `"], models: ["*"]}
  - {name: t, tier: tin, apiKeys: ["sha256:` + zeros(2) + `"], models: ["*"]}
`
	snap, err := Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	a := snap.Admission()
	if !a.Enabled || a.MaxQueueLength != DefaultMaxQueueLength || a.MaxQueueBytes != DefaultMaxQueueBytes ||
		a.MaxQueueWait != 3*time.Second || a.BufferedMessageTimeout != DefaultBufferedMessageTimeout {
		t.Errorf("settings %+v", a)
	}
	gold, tin := &snap.Policy.Spec.Tenants[0], &snap.Policy.Spec.Tenants[1]
	if c := snap.QueueClass(gold); c != (QueueClass{Tier: "gold", Priority: 10, Weight: 3, Headroom: 1}) {
		t.Errorf("gold class %+v", c)
	}
	if c := snap.QueueClass(tin); c != (QueueClass{Tier: "tin", Weight: 1, MinShare: 0.1, Headroom: 0.5}) {
		t.Errorf("tin class %+v", c)
	}
	if w := snap.MaxQueueWait(gold); w != 800*time.Millisecond {
		t.Errorf("gold waits %v, want its tier's 800ms", w)
	}
	if w := snap.MaxQueueWait(tin); w != 3*time.Second {
		t.Errorf("tin waits %v, want spec.admission's 3s cap", w)
	}
	big, _ := snap.Model("big")
	small, _ := snap.Model("small")
	if to, ok := snap.DegradeTo(gold, big); !ok || to != small {
		t.Errorf("gold degrades big to %v, %v", to, ok)
	}
	if _, ok := snap.DegradeTo(tin, big); ok {
		t.Error("tin degrades without a degradeTo")
	}
	if found, ok := snap.Tenant("t"); !ok || found != tin {
		t.Errorf("Tenant(t) = %v, %v", found, ok)
	}
	off, err := Parse("p.yaml", []byte(src[:len("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec:\n")]+src[len("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec:\n  admission: {maxQueueWait: 3s}\n"):]))
	if err != nil {
		t.Fatal(err)
	}
	if off.Admission().Enabled {
		t.Error("admission on without spec.admission")
	}
}

func zeros(n int) string {
	const hex = "0000000000000000000000000000000000000000000000000000000000000000"
	return hex[:63] + string(rune('0'+n))
}
