package rollout

import (
	"math"
	"math/rand/v2"
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

func TestSamplesCollectEachArm(t *testing.T) {
	w := NewSamples()
	t0 := time.Unix(1000, 0)
	w.judgeFrom("m", t0)
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
	early := settle(picker.ArmCandidate, true, director.OutcomeOK, time.Second)
	early.Started = t0.Add(-time.Second) // started before the step's judging began: counted for the step, not judged
	w.Settled(early)
	cand, base := w.Arms("m", 50)
	if base.Requests != 100 || base.Good != 90 || cand.Requests != 41 || cand.Errors != 1 || len(base.TTFT) != 100 || len(cand.TTFT) != 40 {
		t.Fatalf("candidate %+v baseline %+v", cand.Requests, base.Requests)
	}
	if got := math.Exp(quantile(base.TTFT, 0.5)); math.Abs(got-0.150) > 1e-9 {
		t.Errorf("baseline median TTFT %v s, want 0.150", got)
	}
	if n := w.TakeCount("m"); n != 42 || w.TakeCount("m") != 0 {
		t.Errorf("candidate count %d", n)
	}
	w.judgeFrom("m", t0) // the same step: kept
	if cand, _ := w.Arms("m", 50); cand.Requests != 41 {
		t.Errorf("the same start forgot the step: %d", cand.Requests)
	}
	w.judgeFrom("m", t0.Add(time.Minute)) // the next step starts afresh
	if cand, base := w.Arms("m", 50); cand.Requests != 0 || base.Requests != 0 {
		t.Errorf("after the step: %+v %+v", cand, base)
	}
}

// Each latency sample keeps the load stratum its request was placed at, through the arms' merge across
// hardware classes and through the thinned reference the 100 % step judges against.
func TestSamplesKeepTheirLoad(t *testing.T) {
	w := NewSamples()
	w.judgeFrom("m", time.Unix(1000, 0))
	for i := range 600 {
		st := settle(picker.ArmBaseline, true, director.OutcomeOK, time.Duration(1+i)*time.Millisecond)
		st.Load = int64(i / 100) // slower requests at higher loads: 0, 1, 2, 3 (stratum 2), 4, 5 (stratum 3)
		st.HardwareClass = []string{"h100", "l40s"}[i%2]
		w.Settled(st)
	}
	_, base := w.Arms("m", 1000)
	check := func(name string, a Arm) {
		if len(a.TTFTLoad) != len(a.TTFT) || len(a.TPOTLoad) != len(a.TPOT) || len(a.TTFT) == 0 {
			t.Fatalf("%s: %d TTFT with %d strata, %d TPOT with %d", name, len(a.TTFT), len(a.TTFTLoad), len(a.TPOT), len(a.TPOTLoad))
		}
		for i, v := range a.TTFT {
			ms := int(math.Round(math.Exp(v) * 1000))
			if want := loadStratum(int64((ms - 1) / 100)); a.TTFTLoad[i] != want {
				t.Fatalf("%s: %d ms kept with stratum %d, want %d", name, ms, a.TTFTLoad[i], want)
			}
		}
	}
	check("arm", base)
	ref := base.reference()
	check("reference", ref)
	if len(ref.TTFT) != referencePoints {
		t.Errorf("reference of %d points", len(ref.TTFT))
	}
	if old := (Arm{TTFT: []float64{1, 2}}); old.reference().TTFTLoad != nil {
		t.Error("a sample without strata was given some")
	}
}

// A candidate on one hardware class is compared with the baseline's requests on that class, when there are
// enough of them: a faster class in the baseline would otherwise make a healthy candidate look slow.
func TestSamplesCompareTheSameHardwareClass(t *testing.T) {
	w := NewSamples()
	on := func(arm, class string, ttft time.Duration) director.Settlement {
		st := settle(arm, true, director.OutcomeOK, ttft)
		st.HardwareClass = class
		return st
	}
	for range 60 {
		w.Settled(on(picker.ArmCandidate, "l40s", 400*time.Millisecond))
		w.Settled(on(picker.ArmBaseline, "l40s", 400*time.Millisecond))
		w.Settled(on(picker.ArmBaseline, "h100", 100*time.Millisecond))
	}
	_, base := w.Arms("m", 50)
	if base.Requests != 60 || math.Exp(quantile(base.TTFT, 0.5)) != 0.4 {
		t.Errorf("baseline %d requests, median %v: want the 60 on l40s", base.Requests, math.Exp(quantile(base.TTFT, 0.5)))
	}
	if _, base := w.Arms("m", 61); base.Requests != 120 {
		t.Errorf("too few on the class: baseline %d requests, want every class's 120", base.Requests)
	}
}

// The reservoir keeps a bounded, uniform sample: a long step's late requests are as likely to be in it as its
// early ones.
func TestReservoirStaysUniform(t *testing.T) {
	r := reservoir{rng: 1}
	n := 10 * maxSamples
	for i := range n {
		r.add(float64(i), uint16(i%loadStrata))
	}
	if len(r.vals) != maxSamples || len(r.strata) != maxSamples || r.seen != n {
		t.Fatalf("kept %d of %d (%d strata)", len(r.vals), r.seen, len(r.strata))
	}
	var late int
	for i, v := range r.vals {
		if r.strata[i] != uint16(int(v)%loadStrata) {
			t.Fatalf("value %v kept with stratum %d", v, r.strata[i])
		}
		if v >= float64(n/2) {
			late++
		}
	}
	if share := float64(late) / maxSamples; share < 0.47 || share > 0.53 {
		t.Errorf("%.3f of the sample from the second half, want about 0.5", share)
	}
}

// sample draws n log latencies from a log-normal of the given median, deterministically.
func sample(rng *rand.Rand, n int, median, sigma float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Log(median) + sigma*rng.NormFloat64()
	}
	return out
}

func TestEvaluateGates(t *testing.T) {
	p := plan(t)
	g, alpha := p.Gates, p.GateAlpha()
	rng := rand.New(rand.NewPCG(1, 2))
	arm := func(n, good, errors int, ttftMedian, tpotMedian float64) Arm {
		return Arm{Requests: n, Good: good, Errors: errors, TTFT: sample(rng, n, ttftMedian, 0.4), TPOT: sample(rng, n, tpotMedian, 0.3),
			Output: sample(rng, n, 150, 0.8)}
	}
	withOutput := func(a Arm, median float64) Arm {
		a.Output = sample(rng, a.Requests, median, 0.8)
		return a
	}
	withFinish := func(a Arm, finished, unfinished int) Arm {
		a.Finished, a.Unfinished = finished, unfinished
		return a
	}
	base := withFinish(arm(400, 380, 2, 0.2, 0.03), 398, 20)
	for _, tc := range []struct {
		name string
		cand Arm
		want Result
		in   string
	}{
		{"healthy", arm(400, 381, 2, 0.2, 0.03), Pass, ""},
		{"slightly slower, within the margin", arm(400, 380, 2, 0.22, 0.033), Pass, ""},
		{"too few", arm(10, 10, 0, 0.2, 0.03), Insufficient, "need"},
		{"errors", arm(400, 360, 40, 0.2, 0.03), Fail, "error rate"},
		{"goodput", arm(400, 300, 2, 0.2, 0.03), Fail, "goodput"},
		{"slow first token", arm(400, 380, 2, 0.5, 0.03), Fail, "TTFT"},
		{"slow decode", arm(400, 380, 2, 0.2, 0.06), Fail, "TPOT"},
		{"outputs 1.5× longer, within the margin", withOutput(arm(400, 380, 2, 0.2, 0.03), 225), Pass, ""},
		{"rambling outputs", withOutput(arm(400, 380, 2, 0.2, 0.03), 600), Fail, "more than ×2.00"},
		{"terse outputs", withOutput(arm(400, 380, 2, 0.2, 0.03), 30), Fail, "less than ×0.50"},
		{"as many cut short", withFinish(arm(400, 380, 2, 0.2, 0.03), 398, 24), Pass, ""},
		{"more cut at max tokens", withFinish(arm(400, 380, 2, 0.2, 0.03), 398, 90), Fail, "unfinished answers"},
		{"finish reasons unseen", withFinish(arm(400, 380, 2, 0.2, 0.03), 0, 0), Pass, ""},
	} {
		v := Evaluate(g, alpha, tc.cand, base)
		if v.Result != tc.want || !strings.Contains(v.Reason, tc.in) {
			t.Errorf("%s: %v %q, want %v containing %q (evidence %v)", tc.name, v.Result, v.Reason, tc.want, tc.in, v.Figures.Evidence)
		}
	}
}

// The finish gate is the error gate's test on the answers of known finish reason: θ̂ = p̂C − p̂B − margin with
// the Agresti-Caffo adjustment, by hand for 30 of 200 against 10 of 200 and a margin of 0.02.
func TestFinishGateStatistic(t *testing.T) {
	g := policies.RolloutGates{MaxUnfinishedIncrease: 0.02, MinRequests: 50}
	e := finishIncrease(Arm{Finished: 200, Unfinished: 30}, Arm{Finished: 200, Unfinished: 10}, g)
	p1, p2 := 31.0/202, 11.0/202
	if math.Abs(e.Theta-(p1-p2-0.02)) > 1e-12 || math.Abs(e.Variance-(p1*(1-p1)/202+p2*(1-p2)/202)) > 1e-12 {
		t.Errorf("estimate %+v", e)
	}
	if e := finishIncrease(Arm{Finished: 49, Unfinished: 49}, Arm{Finished: 200}, g); e != (Estimate{}) {
		t.Errorf("judged on 49 answers of known finish: %+v", e)
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
