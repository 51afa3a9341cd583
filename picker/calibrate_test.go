package picker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCalibrationStepsAndBounds(t *testing.T) {
	var p predictor
	key := poolKey{"m", "cheap"}
	for range 10 {
		p.calibrate(key, true, 0.99)
	}
	if got, want := p.calib[key].factor, math.Pow(1-calibrationStep, 10); math.Abs(got-want) > 1e-9 {
		t.Fatalf("after 10 misses: factor %v, want %v", got, want)
	}
	for range 200 {
		p.calibrate(key, true, 0.99)
	}
	if got := p.calib[key].factor; got != minCalibration {
		t.Fatalf("after many misses: factor %v, want the floor %v", got, minCalibration)
	}
	for range 100_000 {
		p.calibrate(key, false, 0.99)
	}
	if got := p.calib[key].factor; got != 1 {
		t.Fatalf("after many hits: factor %v, want the ceiling 1 (the policy's margin)", got)
	}
}

// The controller settles where the misses among requests placed as in time are calibrationBudget of the error
// budget, for predictions whose errors a margin within its floor can cover: here a request's TTFT is its
// prediction times a log-normal error, and it is placed as in time when its prediction is within the
// calibrated margin. Predictions noisier than that hold the factor at its floor, still missing: then the
// model's predictions are not trusted (SLO placement ranks by affinity).
func TestCalibrationSettlesOnTheErrorBudget(t *testing.T) {
	for _, spread := range []float64{0.1, 0.2, 1.0} {
		var p predictor
		key := poolKey{"m", "cheap"}
		rng := rand.New(rand.NewPCG(7, uint64(spread*10)))
		const margin, objective = 1.0, 0.99 // a policy margin of 1: the controller has room to settle
		placed, missed := 0, 0
		for i := range 400_000 {
			predicted := 0.2 + 0.8*rng.Float64() // of the target
			p.mu.Lock()
			f := p.factorLocked(key)
			p.mu.Unlock()
			if predicted > min(1, margin*f) {
				continue // not in time: placed elsewhere
			}
			miss := predicted*math.Exp(spread*rng.NormFloat64()) > 1
			p.calibrate(key, miss, objective)
			if i > 100_000 { // past the transient
				placed++
				if miss {
					missed++
				}
			}
		}
		rate, want := float64(missed)/float64(placed), calibrationBudget*(1-objective)
		cands := []scored{{pool: &policies.Pool{Name: "cheap"}}}
		if spread > 0.5 {
			if f := p.calib[key].factor; f > minCalibration*1.1 || p.trustworthy("m", cands, objective) {
				t.Errorf("spread %.1f: factor %v, trusted %v; want the floor and the predictions distrusted", spread, f, p.trustworthy("m", cands, objective))
			}
			continue
		}
		if rate < want/2 || rate > want*1.5 || !p.trustworthy("m", cands, objective) {
			t.Errorf("spread %.1f: misses %.4f of in-time placements, want about %.4f", spread, rate, want)
		}
	}
}

// A pool whose in-time requests keep missing loses the benefit of the doubt: the request the cheap pool met
// before now goes to the fast one, and the pool's calibrated margin is published.
func TestCalibrationMovesRequestsOffAPoolThatMisses(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	p.Metrics = NewMetrics(nil)
	// A new prompt of about 1,200 tokens each time: ~200 ms on the cheap pool, ~75 ms on the fast one, against
	// a 500 ms target.
	prompts := 0
	fresh := func() Input {
		prompts++
		return Input{Tenant: proTenant(snap), Model: m, Request: request(t, strings.Repeat(fmt.Sprintf("sys%d ", prompts), 1200), "q")}
	}
	d, err := p.Pick(snap, fresh())
	if err != nil || d.Pool.Name != "cheap" || !d.Predicted.inTime {
		t.Fatalf("got %v (%v), in time %v: want the cheap pool, predicted in time", d.Pool, err, d.Predicted.inTime)
	}
	// Its requests miss at a TTFT the timing model learns little from (1 % over the target): the margin, not
	// the model, moves them.
	for range 40 {
		p.pred.calibrate(poolKey{"m", "cheap"}, true, 0.99)
	}
	d, err = p.Pick(snap, fresh())
	if err != nil || d.Pool.Name != "fast" {
		t.Fatalf("after the cheap pool's misses: got %v (%v), want the fast pool; scores %+v", d.Pool, err, d.Scores)
	}
	// The metric follows what ObserveTiming learns.
	d, _ = p.Pick(snap, fresh())
	p.ObserveTiming("m", d, 600*time.Millisecond, 10*time.Millisecond)
	want := snap.Routing().SLOMargin * math.Max(minCalibration, 1-calibrationStep)
	if got := testutil.ToFloat64(p.Metrics.Margin.WithLabelValues("m", "fast")); math.Abs(got-want) > 1e-9 {
		t.Errorf("fast pool's margin metric %v after one miss, want %v", got, want)
	}
}

// Predictions far from what is observed are not repaired by a margin: SLO placement ranks by affinity (as
// placement: affinity would), says so in a metric, keeps learning from the requests it places, and relies on
// its predictions again once they agree with what it observes.
func TestWrongPredictionsFallBackToAffinity(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	p.Metrics = NewMetrics(nil)
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, strings.Repeat("sys ", 200), "q")}
	for range trustWindow {
		p.pred.noteRatio("m", 5*time.Second, time.Second) // observed five times the prediction
	}
	d, err := p.Pick(snap, in)
	if err != nil || d.Pool.Name != "fast" {
		t.Fatalf("distrusted: got %v (%v), want the fast pool, as affinity ranks an idle fleet", d.Pool, err)
	}
	if !d.Predicted.set {
		t.Fatal("an untrusted decision carries no prediction to learn from")
	}
	if got := testutil.ToFloat64(p.Metrics.Trusted.WithLabelValues("m")); got != 0 {
		t.Errorf("trusted gauge %v, want 0", got)
	}
	if got := testutil.ToFloat64(p.Metrics.Decisions.WithLabelValues("m", "untrusted")); got != 1 {
		t.Errorf("untrusted decisions %v, want 1", got)
	}
	for range 2 * trustWindow {
		p.pred.noteRatio("m", time.Second, time.Second)
	}
	d, err = p.Pick(snap, in)
	if err != nil || d.Pool.Name != "cheap" {
		t.Fatalf("trusted again: got %v (%v), want the cheap pool", d.Pool, err)
	}
	if got := testutil.ToFloat64(p.Metrics.Trusted.WithLabelValues("m")); got != 1 {
		t.Errorf("trusted gauge %v, want 1", got)
	}
}

// A pool's misses tighten its margin for the prompts it would start, not for a follow-up on the replica that
// holds its prefix: moved, the follow-up would prefill whole elsewhere.
func TestCalibrationLeavesAFollowUpAtItsPrefix(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	// A shared part and a new part of about 900 tokens each: the whole prompt in time on the cheap pool (against
	// a 500 ms target at a margin of 0.8), the new part alone too, but not at the margin the misses tighten.
	sys := strings.Repeat("shared ", 520)
	ask := func(i int) Input {
		return Input{Tenant: proTenant(snap), Model: m, Request: request(t, sys, strings.Repeat(fmt.Sprintf("q%d ", i), 900))}
	}
	first, err := p.Pick(snap, ask(0))
	if err != nil || first.Pool.Name != "cheap" {
		t.Fatalf("got %v (%v), want the cheap pool", first.Pool, err)
	}
	for range 40 {
		p.pred.calibrate(poolKey{"m", "cheap"}, true, 0.99)
	}
	d, err := p.Pick(snap, ask(1))
	if err != nil || d.Endpoints[0] != first.Endpoints[0] {
		t.Fatalf("after the cheap pool's misses the follow-up went to %v (%v), off its prefix on %s; scores %+v",
			d.Endpoints, err, first.Endpoints[0], d.Scores)
	}
	d, err = p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, "another "+sys, "q")})
	if err != nil || d.Pool.Name != "fast" {
		t.Errorf("a prompt no replica holds went to %v (%v), want the fast pool: the cheap one's margin is tightened", d.Pool, err)
	}
}

func TestPrefixHome(t *testing.T) {
	pr := &prompt{tokens: 1000, blockTokens: 100, scale: 1} // ten blocks
	tests := []struct {
		name    string
		matched []int
		want    int
	}{
		{"none", nil, 0},
		{"no prefix held", []int{0, 0, 0}, 0},
		{"held everywhere alike", []int{4, 4}, 0},
		{"one holds a little more: a preamble", []int{1, 0, 0}, 0},
		{"one holds the most, another none", []int{4, 8, 0}, 8},
		{"two hold the most", []int{8, 3, 8}, 8},
		{"all hold most of it", []int{8, 8, 4}, 0},
	}
	for _, tc := range tests {
		cands := make([]scored, len(tc.matched))
		for i, n := range tc.matched {
			cands[i].matched = n
		}
		if got := prefixHome(cands, pr); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
