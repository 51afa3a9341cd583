package picker

import (
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
)

// A prefill-only pool takes no whole request: with SLO placement, affinity or least-in-flight, however long the
// prompt (the H200 prefills fastest) and whoever asks, requests go to the pools that decode. A tier whose only
// class is the prefillers' may not use the model at all.
func TestPrefillOnlyPoolsTakeNoWholeRequest(t *testing.T) {
	policy := strings.Replace(strings.Replace(mixedPolicy,
		`    - {name: fast, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}`,
		`    - {name: fast, hardwareClass: h200, engine: vllm, role: prefill, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}`, 1),
		"    fallbacks:", "    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}\n    fallbacks:", 1)
	snap, m := modelOf(t, policy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	long := strings.Repeat("A long document the model must read before it answers. ", 1500)
	for _, placement := range []string{"slo", "affinity"} {
		s := snap
		if placement == "affinity" {
			s, m = modelOf(t, strings.Replace(policy, "  routing: {debugScores: true}", "  routing: {debugScores: true, placement: affinity}", 1))
		}
		p := newMixedPicker(idleEngines(nil))
		for i := range 20 {
			d, err := p.Pick(s, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, long, string(rune('a'+i))), BodyBytes: len(long)}})
			if err != nil {
				t.Fatal(err)
			}
			if d.Pool.Name != "cheap" {
				t.Fatalf("%s: a whole request went to pool %s", placement, d.Pool.Name)
			}
		}
	}
	least := &LeastInFlight{InFlight: &fleet.InFlight{}}
	for range 8 {
		d, err := least.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{}})
		if err != nil || d.Pool.Name != "cheap" {
			t.Fatalf("least-in-flight chose %v (%v)", d.Pool, err)
		}
	}
	h200Only := strings.Replace(policy, "    free: {hardwareClasses: [l40s]}", "    free: {hardwareClasses: [h200]}", 1)
	snap2, m2 := modelOf(t, h200Only)
	free, _ := snap2.TenantForKey("sk-demo-globex")
	if snap2.Allows(free, m2) {
		t.Error("a tier whose only class holds prefill-only pools may use the model")
	}
}
