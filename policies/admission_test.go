package policies

import (
	"reflect"
	"strings"
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
    gold: {priority: 10, reserve: {big-alias: 0.4}, maxQueueWait: 800ms, degradeTo: [{model: big-alias, to: small}]}
    silver: {priority: 5, reserve: {big: 0.3, small: 0.2}}
    tin: {headroom: 0.5, minShare: 0.1, maxQueueWait: 10s}
  models:
  - {name: big, aliases: [big-alias], pools: [{name: a, hardwareClass: h, engine: vllm, maxConcurrency: 8, endpoints: ["10.0.0.1:1"]}]}
  - {name: small, pools: [{name: b, hardwareClass: h, engine: vllm, maxConcurrency: 8, endpoints: ["10.0.0.2:1"]}]}
  tenants:
  - {name: g, tier: gold, queueWeight: 3, apiKeys: ["sha256:` + zeros(1) + `"], models: ["*"]}
  - {name: t, tier: tin, apiKeys: ["sha256:` + zeros(2) + `"], models: ["*"]}
  - {name: s, tier: silver, apiKeys: ["sha256:` + zeros(3) + `"], models: ["*"]}
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
	gold, tin, silver := &snap.Policy.Spec.Tenants[0], &snap.Policy.Spec.Tenants[1], &snap.Policy.Spec.Tenants[2]
	if c := snap.QueueClass(gold); c != (QueueClass{Tier: "gold", Priority: 10, Weight: 3, Headroom: 1}) {
		t.Errorf("gold class %+v", c)
	}
	if c := snap.QueueClass(tin); c != (QueueClass{Tier: "tin", Weight: 1, MinShare: 0.1, Headroom: 0.5}) {
		t.Errorf("tin class %+v", c)
	}
	big, _ := snap.Model("big")
	small, _ := snap.Model("small")
	goldBig := Reservation{Tier: "gold", Share: 0.4}
	silverBig, silverSmall := Reservation{Tier: "silver", Share: 0.3}, Reservation{Tier: "silver", Share: 0.2}
	for _, c := range []struct {
		tenant  *Tenant
		model   *Model
		reserve float64
		above   []Reservation
	}{
		{gold, big, 0.4, nil},
		{gold, small, 0, nil},
		{silver, big, 0.3, []Reservation{goldBig}},
		{silver, small, 0.2, nil},
		{tin, big, 0, []Reservation{goldBig, silverBig}},
		{tin, small, 0, []Reservation{silverSmall}},
	} {
		if got := snap.Reserve(c.tenant, c.model); got != c.reserve {
			t.Errorf("%s reserves %v of %s, want %v", c.tenant.Name, got, c.model.Name, c.reserve)
		}
		if got := snap.ReservedAbove(c.tenant, c.model); !reflect.DeepEqual(got, c.above) {
			t.Errorf("%s leaves %v of %s free, want %v", c.tenant.Name, got, c.model.Name, c.above)
		}
	}
	if w := snap.MaxQueueWait(gold); w != 800*time.Millisecond {
		t.Errorf("gold waits %v, want its tier's 800ms", w)
	}
	if w := snap.MaxQueueWait(tin); w != 3*time.Second {
		t.Errorf("tin waits %v, want spec.admission's 3s cap", w)
	}
	if to, ok := snap.DegradeTo(gold, big); !ok || to != small {
		t.Errorf("gold degrades big to %v, %v", to, ok)
	}
	if _, ok := snap.DegradeTo(tin, big); ok {
		t.Error("tin degrades without a degradeTo")
	}
	if found, ok := snap.Tenant("t"); !ok || found != tin {
		t.Errorf("Tenant(t) = %v, %v", found, ok)
	}
	// Without spec.admission, and so without the reserves that need it.
	without := strings.NewReplacer("  admission: {maxQueueWait: 3s}\n", "", "reserve: {big-alias: 0.4}, ", "",
		"reserve: {big: 0.3, small: 0.2}", "").Replace(src)
	off, err := Parse("p.yaml", []byte(without))
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

// A reserve holds only on the pools its tier may use: its hardware classes, inside its residency.
func TestReservationCovers(t *testing.T) {
	h200, l40s := &Pool{HardwareClass: "h200", Region: "eu"}, &Pool{HardwareClass: "l40s", Region: "us"}
	bare := &Pool{HardwareClass: "h200"}
	for _, c := range []struct {
		name string
		r    Reservation
		want [3]bool // h200 in eu, l40s in us, h200 without a region
	}{
		{"anywhere", Reservation{Tier: "gold", Share: 0.5}, [3]bool{true, true, true}},
		{"one class", Reservation{Tier: "gold", Share: 0.5, classes: []string{"h200"}}, [3]bool{true, false, true}},
		{"one region", Reservation{Tier: "gold", Share: 0.5, residency: []string{"us"}}, [3]bool{false, true, false}},
	} {
		if got := [3]bool{c.r.Covers(h200), c.r.Covers(l40s), c.r.Covers(bare)}; got != c.want {
			t.Errorf("%s: covers %v, want %v", c.name, got, c.want)
		}
	}
}
