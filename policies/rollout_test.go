package policies

import (
	"math"
	"testing"
	"time"
)

func TestRolloutPlanResolvesPoolsAndDefaults(t *testing.T) {
	snap, err := Parse("p.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  models:
  - name: llama
    pools:
    - {name: v1, hardwareClass: h100, engine: vllm, servedModel: llama-fp8, endpoints: ["10.0.0.1:8000"]}
    - {name: v2, hardwareClass: h100, engine: vllm, servedModel: llama-int4, endpoints: ["10.0.0.2:8000"]}
    rollout:
      candidate: {pool: v2}
      steps: [{percent: 1, minDuration: 1m, minRequests: 50}, {percent: 100}]
      gates: {maxTTFTP95Ratio: 1.2}
      testers: [acme]
      shadow: {percent: 5}
  - name: qwen
    pools:
    - {name: q, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.3:8000"]}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	llama, _ := snap.Model("llama")
	plan, ok := snap.Rollout(llama)
	if !ok {
		t.Fatal("no plan")
	}
	if plan.Candidate != &llama.Pools[1] || len(plan.Baseline) != 1 || plan.Baseline[0] != &llama.Pools[0] {
		t.Errorf("candidate %v, baseline %v", plan.Candidate, plan.Baseline)
	}
	if plan.CandidateServed != "llama-int4" || plan.Compatibility.Model != "llama-int4" {
		t.Errorf("served %q, compatibility %q", plan.CandidateServed, plan.Compatibility.Model)
	}
	want := []PlanStep{{Share: 0.01, MinDuration: time.Minute, MinRequests: 50}, {Share: 1, MinDuration: DefaultRolloutStepDuration, MinRequests: DefaultRolloutStepRequests}}
	if len(plan.Steps) != 2 || plan.Steps[0] != want[0] || plan.Steps[1] != want[1] {
		t.Errorf("steps %+v, want %+v", plan.Steps, want)
	}
	g := plan.Gates
	// maxTTFTP95Ratio is read as its new name, maxTTFTRatio.
	if g.MaxTTFTRatio != 1.2 || g.MaxTPOTRatio != DefaultMaxLatencyRatio || g.MinGoodputRatio != DefaultMinGoodputRatio ||
		g.MaxErrorRateIncrease != DefaultMaxErrorRateIncrease || g.Confidence != DefaultRolloutConfidence ||
		g.MaxUnfinishedIncrease != DefaultMaxUnfinishedIncrease {
		t.Errorf("gates %+v", g)
	}
	// The error budget, 1 %, split over six gates, two steps and the shadow phase.
	if a := plan.GateAlpha(); math.Abs(a-0.01/18) > 1e-12 {
		t.Errorf("gate alpha %v", a)
	}
	wantShadow := ShadowPlan{Share: 0.05, MaxConcurrent: 8, MaxPerSecond: 10, MinDuration: DefaultRolloutStepDuration, MinRequests: DefaultRolloutStepRequests}
	if plan.Shadow == nil || *plan.Shadow != wantShadow {
		t.Errorf("shadow %+v, want %+v", plan.Shadow, wantShadow)
	}
	acme, _ := snap.Tenant("acme")
	if !plan.Tester(acme) || plan.Tester(nil) {
		t.Error("testers")
	}
	qwen, _ := snap.Model("qwen")
	if _, ok := snap.Rollout(qwen); ok {
		t.Error("qwen has no rollout")
	}
}
