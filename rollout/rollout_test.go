package rollout

import (
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

func plan(t *testing.T) *policies.RolloutPlan {
	t.Helper()
	snap, err := policies.Parse("p.yaml", []byte(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  models:
  - name: m
    pools:
    - {name: v1, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.1:8000"]}
    - {name: v2, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.2:8000"]}
    rollout:
      candidate: {pool: v2}
      steps: [{percent: 5, minDuration: 1m, minRequests: 30}, {percent: 50, minDuration: 1m, minRequests: 30}, {percent: 100, minDuration: 1m}]
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	p, _ := snap.Rollout(m)
	return p
}

func settle(arm string, good bool, outcome string, ttft time.Duration) director.Settlement {
	return director.Settlement{Routed: true, Model: "m", Arm: arm, Good: good, Outcome: outcome, HardwareClass: "h100",
		Timing: director.Timing{TTFT: ttft, TPOT: 20 * time.Millisecond, Chunked: true}}
}

func TestWindowsSummariseEachArm(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewWindows(func(string) time.Duration { return time.Minute }, func() time.Time { return now })
	for i := range 100 {
		w.Settled(settle(picker.ArmBaseline, i%10 != 0, director.OutcomeOK, time.Duration(100+i)*time.Millisecond))
	}
	for range 40 {
		w.Settled(settle(picker.ArmCandidate, true, director.OutcomeOK, 300*time.Millisecond))
	}
	w.Settled(settle(picker.ArmCandidate, false, director.OutcomeUpstream5xx, 0))
	w.Settled(settle(picker.ArmCandidate, false, director.OutcomeClientError, 0))                                            // the tenant's doing
	w.Settled(director.Settlement{Routed: true, Model: "m", Arm: picker.ArmCandidate, HardwareClass: director.ManagedClass}) // overflow
	w.Settled(director.Settlement{Routed: true, Model: "m"})                                                                 // no rollout arm
	cand, base := w.Summaries("m")
	if base.Requests != 100 || base.Good != 90 || cand.Requests != 41 || cand.Errors != 1 {
		t.Fatalf("candidate %+v baseline %+v", cand, base)
	}
	// The baseline's TTFTs are 100..199 ms: the p95 bucket holds 195 ms, within the buckets' 10 %.
	if p := base.TTFTP95; p < 190*time.Millisecond || p > 215*time.Millisecond {
		t.Errorf("baseline TTFT p95 %v", p)
	}
	if n := w.TakeCount("m"); n != 41 || w.TakeCount("m") != 0 {
		t.Errorf("candidate count %d", n)
	}
	now = now.Add(61 * time.Second) // the window has passed
	if cand, base := w.Summaries("m"); cand.Requests != 0 || base.Requests != 0 {
		t.Errorf("after the window: %+v %+v", cand, base)
	}
}

func TestEvaluateGates(t *testing.T) {
	g := plan(t).Gates
	base := Summary{Requests: 200, Good: 190, Errors: 2, TTFTP95: 200 * time.Millisecond, TPOTP95: 30 * time.Millisecond}
	for _, tc := range []struct {
		name string
		cand Summary
		want Result
		in   string
	}{
		{"healthy", Summary{Requests: 50, Good: 48, Errors: 0, TTFTP95: 210 * time.Millisecond, TPOTP95: 31 * time.Millisecond}, Pass, ""},
		{"too few", Summary{Requests: 10, Good: 10}, Insufficient, "need"},
		{"errors", Summary{Requests: 50, Good: 40, Errors: 5, TTFTP95: 200 * time.Millisecond}, Fail, "error rate"},
		{"goodput", Summary{Requests: 50, Good: 40, TTFTP95: 200 * time.Millisecond}, Fail, "goodput"},
		{"slow first token", Summary{Requests: 50, Good: 48, TTFTP95: 600 * time.Millisecond}, Fail, "TTFT"},
		{"slow decode", Summary{Requests: 50, Good: 48, TTFTP95: 200 * time.Millisecond, TPOTP95: 90 * time.Millisecond}, Fail, "TPOT"},
	} {
		v := Evaluate(g, tc.cand, base)
		if v.Result != tc.want || !strings.Contains(v.Reason, tc.in) {
			t.Errorf("%s: %v %q, want %v containing %q", tc.name, v.Result, v.Reason, tc.want, tc.in)
		}
	}
}

func TestStateWalksTheSteps(t *testing.T) {
	p := plan(t)
	t0 := time.Unix(0, 0)
	s := State{Phase: Progressing, StepStarted: t0}
	pass := Verdict{Result: Pass}
	if s.Share(p) != 0.05 {
		t.Fatalf("share %v", s.Share(p))
	}
	// Passing gates hold the step until its duration and requests are reached.
	if next, changed := s.Advance(p, pass, 100, t0.Add(30*time.Second)); changed || next.Step != 0 {
		t.Fatal("advanced before the step's minimum duration")
	}
	s, _ = s.Advance(p, pass, 10, t0.Add(30*time.Second))
	if _, changed := s.Advance(p, pass, 0, t0.Add(2*time.Minute)); changed {
		t.Fatalf("advanced with %d of the step's 30 requests", s.StepRequests)
	}
	if next, changed := s.Advance(p, pass, 25, t0.Add(2*time.Minute)); !changed || next.Step != 1 || next.StepRequests != 0 {
		t.Fatalf("step 0 with its time and %d requests did not advance: %+v", s.StepRequests, next)
	} else {
		s = next
	}
	if _, changed := s.Advance(p, Verdict{Result: Insufficient}, 100, t0.Add(time.Hour)); changed {
		t.Fatal("insufficient data advanced")
	}
	s, _ = s.Advance(p, pass, 100, t0.Add(4*time.Minute))
	if s.Step != 2 || s.Share(p) != 1 {
		t.Fatalf("%+v", s)
	}
	s, _ = s.Advance(p, pass, 1000, t0.Add(6*time.Minute))
	if s.Phase != Promoted || s.Share(p) != 1 {
		t.Fatalf("after the last step: %+v", s)
	}
}

func TestStateRollsBackAndObeysOperators(t *testing.T) {
	p := plan(t)
	t0 := time.Unix(0, 0)
	s := State{Phase: Progressing, Step: 1, StepStarted: t0}
	s, changed := s.Advance(p, Verdict{Result: Fail, Reason: "TTFT p95"}, 5, t0.Add(time.Second))
	if !changed || s.Phase != RolledBack || s.Share(p) != 0 || s.Reason != "TTFT p95" {
		t.Fatalf("a failed gate: %+v", s)
	}
	if _, changed := s.Advance(p, Verdict{Result: Pass}, 100, t0.Add(time.Hour)); changed {
		t.Fatal("a rolled-back rollout advanced by itself")
	}
	s, ok := s.Apply(Resume, t0.Add(time.Hour))
	if !ok || s.Phase != Checking || s.Step != 0 || s.Share(p) != 0 {
		t.Fatalf("resume after rollback: %+v", s)
	}
	s.Phase = Progressing // the compatibility gate passed
	s, _ = s.Apply(Pause, t0.Add(time.Hour))
	if s.Phase != Paused || s.Share(p) != 0.05 {
		t.Fatalf("paused: %+v", s)
	}
	if _, changed := s.Advance(p, Verdict{Result: Fail}, 0, t0.Add(2*time.Hour)); changed {
		t.Fatal("a paused rollout rolled back by itself")
	}
	if _, ok := s.Apply(Pause, t0); ok {
		t.Error("pausing a paused rollout applied")
	}
	s, _ = s.Apply(Abort, t0)
	if s.Phase != Aborted || s.Share(p) != 0 {
		t.Fatalf("aborted: %+v", s)
	}
	s, _ = s.Apply(Promote, t0)
	if s.Phase != Promoted || s.Share(p) != 1 {
		t.Fatalf("promoted: %+v", s)
	}
	if _, ok := s.Apply(Abort, t0); ok {
		t.Error("aborting a promoted rollout applied")
	}
}
