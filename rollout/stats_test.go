package rollout

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// The Mann-Whitney estimate and its DeLong variance against values worked by hand.
func TestShiftedMannWhitneyByHand(t *testing.T) {
	for _, tc := range []struct {
		name        string
		x, y        []float64
		shift       float64
		theta, vari float64
	}{
		// x above y in 6 of 12 pairs: θ = ½ − ½ = 0. Placements of x: ¼, ½, ¾ (sample variance 1/16, over
		// 3); of y: 1, ⅔, ⅓, 0 (sample variance 5/27, over 4): V = 1/48 + 5/108.
		{"interleaved", []float64{1, 2, 3}, []float64{0.5, 1.5, 2.5, 3.5}, 0, 0, 1.0/48 + 5.0/108},
		// y+1 = 2, 4, 4: x=2 ties one (⅙), x=4 is above one and ties two (⅔); θ = 5/12 − ½. Placements of
		// x: ⅙, ⅔ (sample variance 1/8, over 2); of y: ¾, ¼, ¼ (sample variance 1/12, over 3): V = 1/16 + 1/36.
		{"ties after the shift", []float64{2, 4}, []float64{1, 3, 3}, 1, -1.0 / 12, 1.0/16 + 1.0/36},
		// Entirely above: θ = ½, placements all 1 and 0 (variance 0), floored at (n+m+1)/(48nm) = 5/192.
		{"separate", []float64{10, 11}, []float64{1, 2}, 0, 0.5, 5.0 / 192},
	} {
		e := shiftedMannWhitney(tc.x, tc.y, tc.shift)
		if !near(e.Theta, tc.theta, 1e-12) || !near(e.Variance, tc.vari, 1e-12) {
			t.Errorf("%s: θ %v V %v, want %v and %v", tc.name, e.Theta, e.Variance, tc.theta, tc.vari)
		}
	}
}

// The rate estimates with Agresti and Caffo's adjustment, by hand.
func TestRateEstimatesByHand(t *testing.T) {
	// 5 errors in 98 against none in 98, margin 0.01: p̃ = 6/100 and 1/100, θ = 0.06 − 0.01 − 0.01 = 0.04,
	// V = 0.06·0.94/100 + 0.01·0.99/100 = 0.000663.
	e := rateIncrease(5, 98, 0, 98, 0.01)
	if !near(e.Theta, 0.04, 1e-12) || !near(e.Variance, 0.000663, 1e-12) {
		t.Errorf("errors: %+v", e)
	}
	// Goodput 79 of 98 against 94 of 98, ratio 0.95: p̃ = 0.8 and 0.95, θ = 0.95·0.95 − 0.8 = 0.1025,
	// V = 0.8·0.2/100 + 0.9025·0.95·0.05/100 = 0.0016 + 0.000428688 = 0.002028688 (rounded below).
	g := rateShortfall(79, 98, 94, 98, 0.95)
	if !near(g.Theta, 0.1025, 1e-12) || !near(g.Variance, 0.0016+0.9025*0.95*0.05/100, 1e-12) {
		t.Errorf("goodput: %+v", g)
	}
}

// The closed form of the half-normal mixture's likelihood ratio against numerical integration of its
// definition, ∫ exp((θθ̂ − θ²/2)/V)·2φ(θ/τ)/τ dθ over θ > 0.
func TestMixtureLikelihoodRatio(t *testing.T) {
	for _, e := range []Estimate{{0.1, 0.01}, {-0.05, 0.002}, {0.3, 0.0005}, {0, 0.04}} {
		for _, tau := range []float64{0.03, 0.1} {
			const steps = 200000
			h := 12 * tau / steps
			var sum float64
			for i := range steps {
				th := (float64(i) + 0.5) * h
				sum += math.Exp((th*e.Theta-th*th/2)/e.Variance) * 2 / (tau * math.Sqrt(2*math.Pi)) * math.Exp(-th*th/(2*tau*tau)) * h
			}
			if got, want := logMixtureLR(e, tau), math.Log(sum); !near(got, want, 1e-6*math.Max(1, math.Abs(want))) {
				t.Errorf("%+v τ %v: log Λ %v, want %v", e, tau, got, want)
			}
		}
	}
	// 0.1 over V 0.01 and τ 0.1 by hand: ln 2 + ½ln ½ + 0.25 + ln Φ(1/√2) = 0.322466.
	if got := logMixtureLR(Estimate{0.1, 0.01}, 0.1); !near(got, 0.3224656, 1e-6) {
		t.Errorf("log Λ %v, want 0.3224656", got)
	}
	if got := logMixtureLR(Estimate{0.1, 0}, 0.1); !math.IsInf(got, -1) {
		t.Errorf("no variance, no evidence: %v", got)
	}
}

// The sequential correction: a gate looked at after every few requests of a candidate identical to the
// baseline rejects in at most α of runs, where the same data tested at each look at a fixed level would
// reject several times as often. (Gaussian theory bounds the first; the second is what the gates did before.)
func TestLookingOftenDoesNotInflateFalseRollbacks(t *testing.T) {
	const runs, looks, every, alpha = 400, 40, 25, 0.05
	rng := rand.New(rand.NewPCG(7, 11))
	var sequential, naive int
	for range runs {
		var x, y []float64
		var errsC, errsB int
		var seqHit, naiveHit bool
		for k := 1; k <= looks; k++ {
			for range every {
				x, y = append(x, rng.NormFloat64()), append(y, rng.NormFloat64())
				if rng.Float64() < 0.02 {
					errsC++
				}
				if rng.Float64() < 0.02 {
					errsB++
				}
			}
			n := k * every
			for _, gate := range []struct {
				e   Estimate
				tau float64
			}{
				{shiftedMannWhitney(append([]float64(nil), x...), append([]float64(nil), y...), 0), tauLatency},
				{rateIncrease(errsC, n, errsB, n, 0), tauErrors},
			} {
				seqHit = seqHit || logMixtureLR(gate.e, gate.tau) >= math.Log(2/alpha) // α/2 per gate
				// A fixed one-sided z test at α/2 per gate, repeated at every look.
				naiveHit = naiveHit || gate.e.Theta/math.Sqrt(gate.e.Variance) > 1.96
			}
		}
		if seqHit {
			sequential++
		}
		if naiveHit {
			naive++
		}
	}
	if rate := float64(sequential) / runs; rate > alpha {
		t.Errorf("sequential false rejections %.3f, want at most %.2f", rate, alpha)
	}
	if naive < 3*sequential || float64(naive)/runs < 2*alpha {
		t.Errorf("repeated fixed tests rejected %d of %d, the sequential test %d: the correction shows nothing", naive, runs, sequential)
	}
	t.Logf("false rejections over %d looks: sequential %d of %d, repeated fixed tests %d", looks, sequential, runs, naive)
}

// The stratified estimate by hand: two strata both arms share, each θ̂ weighted by n·m/(n+m); a stratum with
// fewer than stratumMinimum of an arm has its variance no smaller than under equal distributions; strata only
// one arm has (here 3, and 4 with one baseline value) add nothing.
func TestStratifiedShiftByHand(t *testing.T) {
	x := []float64{1, 2, 3, 10, 11, 12, 13, 14, 50, 51, 60}
	xs := []uint16{0, 0, 0, 1, 1, 1, 1, 1, 3, 3, 4}
	y := []float64{0.5, 1.5, 2.5, 3.5, 1, 2, 3, 4, 70}
	ys := []uint16{0, 0, 0, 0, 1, 1, 1, 1, 4}
	v0 := max(1.0/48+5.0/108, 8.0/(12*3*4)) // TestShiftedMannWhitneyByHand's interleaved case
	v1 := 10.0 / (12 * 5 * 4)               // entirely above: θ = ½, the equal-distribution variance
	w0, w1 := 12.0/7, 20.0/9
	want := Estimate{Theta: w1 * 0.5 / (w0 + w1), Variance: (w0*w0*v0 + w1*w1*v1) / ((w0 + w1) * (w0 + w1))}
	e := stratifiedShift(x, xs, y, ys, 0)
	if !near(e.Theta, want.Theta, 1e-12) || !near(e.Variance, want.Variance, 1e-12) {
		t.Errorf("stratified: %+v, want %+v", e, want)
	}
	// Without strata on either arm (a reference saved before them), or with too few in the shared strata, the
	// arms are compared whole.
	whole := shiftedMannWhitney(slices.Clone(x), slices.Clone(y), 0)
	for name, e := range map[string]Estimate{
		"no strata":         stratifiedShift(x, nil, y, ys, 0),
		"too few in shared": stratifiedShift(x, xs, y, []uint16{0, 0, 0, 0, 2, 2, 2, 2, 4}, 0),
	} {
		if e != whole {
			t.Errorf("%s: %+v, want the whole arms' %+v", name, e, whole)
		}
	}
}

// Latency depends on load (an idle engine answers at once, a busy one after its step), and a fixed candidate
// pool at a step above its share of the fleet is busier than the baseline's: compared whole, a healthy
// candidate looks five times slower; compared at the same load it passes, while one slower at the same load
// fails, and one so slow that it runs at loads the baseline never saw is compared whole.
func TestLatencyGatesCompareAtTheSameLoad(t *testing.T) {
	p := plan(t)
	g, alpha := p.Gates, p.GateAlpha()
	rng := rand.New(rand.NewPCG(3, 4))
	// arm draws n requests, idle of them at load 0 (3 ms) and the rest at loads 1-7 (18 ms), times slower.
	arm := func(n, idle int, slower float64, loads ...int64) Arm {
		if len(loads) == 0 {
			loads = []int64{1, 2, 3, 5, 7}
		}
		a := Arm{Requests: n, Good: n}
		for i := range n {
			load, median := int64(0), 0.003
			if i >= idle {
				load, median = loads[i%len(loads)], 0.018
			}
			a.TTFT = append(a.TTFT, math.Log(slower*median)+0.2*rng.NormFloat64())
			a.TTFTLoad = append(a.TTFTLoad, loadStratum(load))
			a.TPOT = append(a.TPOT, math.Log(0.01)+0.1*rng.NormFloat64())
			a.TPOTLoad = append(a.TPOTLoad, loadStratum(load))
		}
		return a
	}
	unstratified := func(a Arm) Arm { a.TTFTLoad, a.TPOTLoad = nil, nil; return a }
	base := arm(300, 200, 1)
	for _, tc := range []struct {
		name       string
		cand, base Arm
		want       Result
	}{
		{"healthy and busier", arm(300, 60, 1), base, Pass},
		{"healthy and busier, compared whole", unstratified(arm(300, 60, 1)), base, Fail},
		{"1.6× slower at the same load", arm(300, 200, 1.6), base, Fail},
		{"1.6× slower and busier", arm(300, 60, 1.6), base, Fail},
		{"3× slower at loads the baseline never saw", arm(300, 0, 3, 40, 50, 60), arm(300, 0, 1, 1), Fail},
	} {
		v := Evaluate(g, alpha, tc.cand, tc.base)
		if v.Result != tc.want || tc.want == Fail && !strings.Contains(v.Reason, "TTFT") {
			t.Errorf("%s: %v %q, want %v (evidence %v)", tc.name, v.Result, v.Reason, tc.want, v.Figures.Evidence)
		}
	}
}
