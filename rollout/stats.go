package rollout

import (
	"math"
	"slices"
)

// The gates' statistics. Each gate asks one one-sided question of the candidate against the baseline with a
// margin the operator states — "is the candidate's latency more than r times the baseline's?", "is its error
// rate more than m above?" — as an estimate θ̂ of a quantity θ that is ≤ 0 when the candidate is within the
// margin, with the estimate's variance V. The rollout checks every gate at every tick, so a fixed-sample test
// would reject a healthy candidate far more often than its level says. Each gate's evidence is instead a
// mixture sequential probability ratio (mSPRT: Robbins 1970; Johari et al., "Always valid inference", 2017):
// Λ = ∫ N(θ̂; θ, V)/N(θ̂; 0, V) π(dθ) over a half-normal prior of scale τ on θ > 0. Under θ ≤ 0 it is a
// nonnegative supermartingale (as far as θ̂ is normal, which the minimum sample stands for), so by Ville's
// inequality the chance that it ever reaches 1/α, however often it is looked at, is at most α.

// Estimate is a gate's estimate of its θ and the estimate's variance.
type Estimate struct {
	Theta, Variance float64
}

// logMixtureLR is log Λ for an estimate under the half-normal mixture of scale tau:
// Λ = 2·√(V/(V+τ²))·exp(θ̂²τ²/(2V(V+τ²)))·Φ(θ̂τ/√(V(V+τ²))).
func logMixtureLR(e Estimate, tau float64) float64 {
	v, t2 := e.Variance, tau*tau
	if !(v > 0) || math.IsInf(v, 0) || math.IsNaN(e.Theta) {
		return math.Inf(-1)
	}
	s := v + t2
	return math.Ln2 + 0.5*math.Log(v/s) + e.Theta*e.Theta*t2/(2*v*s) + logNormalCDF(e.Theta*tau/math.Sqrt(v*s))
}

// logNormalCDF is log Φ(z), accurate in the far left tail too.
func logNormalCDF(z float64) float64 {
	if z > -30 {
		return math.Log(0.5 * math.Erfc(-z/math.Sqrt2))
	}
	// Φ(z) ≈ φ(z)/|z| · (1 − 1/z²) for z ≪ 0.
	return -z*z/2 - math.Log(-z) - 0.5*math.Log(2*math.Pi) + math.Log1p(-1/(z*z))
}

// shiftedMannWhitney estimates θ = P(X > Y + shift) + ½P(X = Y + shift) − ½ for samples x and y (log
// latencies: shift = log r asks whether the candidate is more than r times the baseline), with DeLong's
// variance from the placements, which does not assume the two distributions equal. Both inputs are sorted
// in place.
func shiftedMannWhitney(x, y []float64, shift float64) Estimate {
	n, m := len(x), len(y)
	if n < 2 || m < 2 {
		return Estimate{}
	}
	slices.Sort(x)
	slices.Sort(y)
	// vx[i]: the share of y (shifted) below x[i], ties half; wy[j]: the share of x above y[j]+shift.
	var sumV, sumV2, sumW, sumW2 float64
	lo, hi := 0, 0 // y[:lo] < x[i]-shift, y[:hi] <= x[i]-shift
	for _, xi := range x {
		for lo < m && y[lo]+shift < xi {
			lo++
		}
		for hi < m && y[hi]+shift <= xi {
			hi++
		}
		v := (float64(lo) + 0.5*float64(hi-lo)) / float64(m)
		sumV, sumV2 = sumV+v, sumV2+v*v
	}
	lo, hi = 0, 0 // x[:lo] <= y[j]+shift, x[:hi] < y[j]+shift
	for _, yj := range y {
		t := yj + shift
		for hi < n && x[hi] < t {
			hi++
		}
		for lo < n && x[lo] <= t {
			lo++
		}
		w := (float64(n-lo) + 0.5*float64(lo-hi)) / float64(n)
		sumW, sumW2 = sumW+w, sumW2+w*w
	}
	theta := sumV / float64(n)
	varV := (sumV2 - sumV*sumV/float64(n)) / float64(n-1)
	varW := (sumW2 - sumW*sumW/float64(m)) / float64(m-1)
	return Estimate{Theta: theta - 0.5, Variance: max(varV/float64(n)+varW/float64(m), floorVariance(n, m))}
}

// stratumMinimum is the fewest samples of each arm the load strata both arms share must hold for the arms to
// be compared stratum by stratum; a stratum with fewer of an arm also has its variance taken no smaller than it
// is when the arms are drawn from one distribution.
const stratumMinimum = 8

// stratifiedShift is shiftedMannWhitney within each load stratum both arms have at least two samples of,
// combined with van Elteren's weights (a stratum's n·m/(n+m)): the arms are compared at the same load, so that
// a candidate carrying more requests per engine than the baseline — a fixed candidate pool at a step above its
// share of the capacity — is not judged slower for the load alone, while one slower at the same load is.
// Samples at a load the other arm has not seen say nothing about that. When the shared strata hold fewer than
// stratumMinimum of either arm — the arms ran at loads too far apart, or there are no strata — the arms are
// compared whole, as without strata: a candidate so slow that its engines fill beyond any load the baseline saw
// is still judged.
func stratifiedShift(x []float64, xs []uint16, y []float64, ys []uint16, shift float64) Estimate {
	shared := sharedStrata(xs, len(x), ys, len(y))
	if shared == nil {
		return shiftedMannWhitney(slices.Clone(x), slices.Clone(y), shift)
	}
	var num, den, variance float64
	for _, s := range shared {
		gx, gy := inStratum(x, xs, s), inStratum(y, ys, s)
		n, m := len(gx), len(gy)
		e := shiftedMannWhitney(gx, gy, shift)
		if min(n, m) < stratumMinimum {
			e.Variance = max(e.Variance, float64(n+m+1)/(12*float64(n)*float64(m)))
		}
		w := float64(n*m) / float64(n+m)
		num, den, variance = num+w*e.Theta, den+w, variance+w*w*e.Variance
	}
	return Estimate{Theta: num / den, Variance: variance / (den * den)}
}

// sharedStrata are the load strata with at least two samples of each arm, or nil when they hold fewer than
// stratumMinimum of either arm in all (or an arm has no strata).
func sharedStrata(xs []uint16, nx int, ys []uint16, ny int) []uint16 {
	if len(xs) != nx || len(ys) != ny {
		return nil
	}
	var cx, cy [loadStrata]int
	for _, s := range xs {
		cx[min(int(s), loadStrata-1)]++
	}
	for _, s := range ys {
		cy[min(int(s), loadStrata-1)]++
	}
	var shared []uint16
	var sx, sy int
	for s := range uint16(loadStrata) {
		if cx[s] >= 2 && cy[s] >= 2 {
			shared, sx, sy = append(shared, s), sx+cx[s], sy+cy[s]
		}
	}
	if sx < stratumMinimum || sy < stratumMinimum {
		return nil
	}
	return shared
}

// inStratum is a copy of the values of stratum s.
func inStratum(v []float64, strata []uint16, s uint16) []float64 {
	var out []float64
	for i, t := range strata {
		if min(t, loadStrata-1) == s {
			out = append(out, v[i])
		}
	}
	return out
}

// floorVariance keeps a degenerate sample (every value tied, or one arm entirely above the other, where the
// placements' variance is 0) from claiming certainty: a quarter of the variance θ̂ has when the two arms are
// drawn from one distribution, (n+m+1)/(12·n·m).
func floorVariance(n, m int) float64 {
	return float64(n+m+1) / (48 * float64(n) * float64(m))
}

// rateIncrease estimates θ = pC − pB − margin (errors: how far the candidate's rate exceeds the baseline's
// beyond the tolerated increase) for the candidate's k1 of n1 against the baseline's k2 of n2, with Agresti and
// Caffo's adjustment (one success and one failure added to each arm), which keeps the
// variance honest when an arm has seen no errors at all.
func rateIncrease(k1, n1, k2, n2 int, margin float64) Estimate {
	if n1 == 0 || n2 == 0 {
		return Estimate{}
	}
	p1 := (float64(k1) + 1) / (float64(n1) + 2)
	p2 := (float64(k2) + 1) / (float64(n2) + 2)
	return Estimate{Theta: p1 - p2 - margin, Variance: p1*(1-p1)/(float64(n1)+2) + p2*(1-p2)/(float64(n2)+2)}
}

// rateShortfall estimates θ = r·pB − pC: how far the candidate's rate (goodput) falls below r times the
// baseline's, adjusted as rateIncrease.
func rateShortfall(k1, n1, k2, n2 int, r float64) Estimate {
	if n1 == 0 || n2 == 0 {
		return Estimate{}
	}
	p1 := (float64(k1) + 1) / (float64(n1) + 2)
	p2 := (float64(k2) + 1) / (float64(n2) + 2)
	return Estimate{Theta: r*p2 - p1, Variance: p1*(1-p1)/(float64(n1)+2) + r*r*p2*(1-p2)/(float64(n2)+2)}
}
