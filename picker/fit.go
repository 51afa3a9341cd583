package picker

import "math"

// fitDims is how many coefficients a fit has at most: an intercept and three features.
const fitDims = 4

// fit is a least-squares fit y ≈ θ·x over exponentially weighted observations, pulled toward a prior θ₀ by a
// ridge term worth ridgeWeight observations: with no data it predicts the prior, and it moves to what the
// endpoint really does as observations arrive, forgetting old ones (weight decay per observation) as the
// endpoint's behaviour drifts. Normal equations (Σ w x xᵀ + ρI) θ = Σ w x y + ρθ₀, solved on demand.
//
// A guarded feature is predicted, past the largest value of it observed, at the steeper of the fitted and the
// prior's slope: a slope learnt over a narrow range says little outside it, and the prior's comes from the pool's
// stated speeds. The TPOT model guards its running batch: a P/D decoder that has run small batches learns a flat
// slope there, and without the guard would take a burst's decodes as if they cost it nothing. It guards its
// prefill share too (given a prior, from the pool's batch size): a replica that has decoded only beside light
// prefill has not shown what a heavy one costs. The TTFT model guards its prefill term (a decoder that only gets
// the short prompts splits leave it).
type fit struct {
	dims   int
	prior  [fitDims]float64
	sxx    [fitDims][fitDims]float64
	sxy    [fitDims]float64
	n      float64 // weighted observations
	guards [fitDims]bool
	seen   [fitDims]float64 // the largest value of each guarded feature observed
	theta  [fitDims]float64
	stale  bool // theta needs solving
}

// fitDecay is each observation's weight loss per later observation: a window of about 1/(1−decay) = 200.
const fitDecay = 0.995

// ridgeWeight is how many observations' worth the prior counts for.
const ridgeWeight = 0.1

func newFit(prior ...float64) fit {
	f := fit{dims: len(prior)}
	copy(f.prior[:], prior)
	f.theta = f.prior
	return f
}

// guarded is f with features guarded (see fit); feature 0, the intercept, is never guarded.
func (f fit) guarded(features ...int) fit {
	for _, i := range features {
		f.guards[i] = i > 0
	}
	return f
}

// observe adds one observation; x[0] is 1 for the intercept. One that is not finite is dropped: it would
// poison every later prediction.
func (f *fit) observe(x [fitDims]float64, y float64) {
	if !finite(y) {
		return
	}
	for _, v := range x {
		if !finite(v) {
			return
		}
	}
	for i := range f.dims {
		for j := range f.dims {
			f.sxx[i][j] = fitDecay*f.sxx[i][j] + x[i]*x[j]
		}
		f.sxy[i] = fitDecay*f.sxy[i] + x[i]*y
	}
	f.n = fitDecay*f.n + 1
	for i := range f.dims {
		if f.guards[i] {
			f.seen[i] = max(f.seen[i], x[i])
		}
	}
	f.stale = true
}

// predict is θ·x with θ solved from the observations so far, each guarded feature past its observed range at
// the steeper slope.
func (f *fit) predict(x [fitDims]float64) float64 {
	if f.stale {
		f.solve()
	}
	y := 0.0
	for i := range f.dims {
		y += f.theta[i] * x[i]
		if f.guards[i] && x[i] > f.seen[i] {
			y += (max(f.theta[i], f.prior[i]) - f.theta[i]) * (x[i] - f.seen[i])
		}
	}
	return y
}

// finite says whether v is neither NaN nor infinite.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// coef is the fit's i-th coefficient, solved from the observations so far.
func (f *fit) coef(i int) float64 {
	if f.stale {
		f.solve()
	}
	return f.theta[i]
}

// solve runs Gaussian elimination with partial pivoting on the regularised normal equations; a singular
// system (it cannot be, with ρ > 0, short of overflow) keeps the previous θ.
func (f *fit) solve() {
	f.stale = false
	n := f.dims
	var a [fitDims][fitDims + 1]float64
	for i := range n {
		for j := range n {
			a[i][j] = f.sxx[i][j]
		}
		a[i][i] += ridgeWeight
		a[i][n] = f.sxy[i] + ridgeWeight*f.prior[i]
	}
	for col := range n {
		pivot := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[pivot][col]) {
				pivot = r
			}
		}
		if math.Abs(a[pivot][col]) < 1e-12 {
			return
		}
		a[col], a[pivot] = a[pivot], a[col]
		for r := range n {
			if r == col {
				continue
			}
			k := a[r][col] / a[col][col]
			for c := col; c <= n; c++ {
				a[r][c] -= k * a[col][c]
			}
		}
	}
	var theta [fitDims]float64
	for i := range n {
		theta[i] = a[i][n] / a[i][i]
		if math.IsNaN(theta[i]) || math.IsInf(theta[i], 0) {
			return
		}
	}
	f.theta = theta
}
