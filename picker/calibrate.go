package picker

import (
	"math"
	"time"
)

// Calibration. A prediction is a point estimate, and how far the real TTFT strays from it depends on the fleet:
// how full the batches run, how bursty arrivals are, what the model leaves out. So whether a prediction
// "meets" the target is judged against a margin learnt per pool from what happened to the requests placed
// there because they were predicted in time: each one that missed its target shrinks the pool's factor by
// calibrationStep, each one that met it grows the factor by calibrationStep × b ÷ (1 − b), b being
// calibrationBudget of the tier's error budget (1 − objective). The factor settles where the pool's misses
// among predicted-in-time requests are b, or at 1 if they miss less: a pool whose predictions run optimistic
// is trusted with less of the target, one whose predictions are good with the policy's margin; the rest of the
// error budget is left to what placement cannot foresee (bursts, faults). The effective margin is
// routing.sloMargin × factor, within [minCalibration × sloMargin, sloMargin]: calibration only tightens the
// margin, never loosens it past the policy's, for the spread a pool's TTFTs show is judged already (see
// Judging at the tail), and a margin loosened until misses reach b spends error budget a policy that spreads
// its load would not (bench-placement: at a third of capacity round-robin served every request in time and
// SLO placement, loosened, 99.5 %). With the admission queue, a request that
// no endpoint meets waits, so a shrunken margin would hold requests an endpoint would have served in time:
// there the policy's margin applies as it is (the factor still learns). So it does for the candidates that hold
// the most of the prompt, half of it or more beyond another's (prefixHome).
const (
	calibrationStep   = 0.05
	calibrationBudget = 0.5
	minCalibration    = 0.25
)

// Trust. When the predictions are wrong past what a margin repairs, SLO placement stops relying on them and
// ranks by affinity and load, as placement: affinity does, until they recover: a model is distrusted while the
// observed ÷ predicted TTFT of its requests, as a geometric mean over about trustWindow of them (once it has
// had trustWindow: the first predictions are the priors', which the fit corrects within a few dozen
// observations, and judging the model on them sent a cold fleet's requests by affinity onto an endpoint
// predicted late), is beyond distrustRatio either way, or while every pool it has placed on is at
// minCalibration (within a step) and still missing more than twice the error budget though the fleet is not
// overloaded (under overload, misses are the load's, and the overload rule, which ranking by affinity would
// give up, is what protects goodput).
const (
	trustWindow   = 64
	distrustRatio = 2.0
)

// calibration is what the picker has learnt of one pool's predictions.
type calibration struct {
	factor float64 // 0 until the first observation: 1
	misses float64 // share of predicted-in-time requests that missed, over about trustWindow of them
}

// modelTrust is what the picker has learnt of one model's predictions.
type modelTrust struct {
	logRatio float64 // mean log(observed ÷ predicted TTFT) over about trustWindow requests
	n        int
}

// poolKey names a pool of a model.
type poolKey struct{ model, pool string }

// factorLocked is a pool's calibration factor (1 before it has observations); p.mu is held.
func (p *predictor) factorLocked(key poolKey) float64 {
	if c, ok := p.calib[key]; ok && c.factor > 0 {
		return c.factor
	}
	return 1
}

// calibrate learns from one request placed because it was predicted in time: whether it met its target.
func (p *predictor) calibrate(key poolKey, missed bool, objective float64) (factor float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calib == nil {
		p.calib = map[poolKey]*calibration{}
	}
	c := p.calib[key]
	if c == nil {
		c = &calibration{factor: 1}
		p.calib[key] = c
	}
	budget := calibrationBudget * (1 - min(max(objective, 0.5), 0.9999))
	x := 0.0
	if missed {
		x = 1
		c.factor *= 1 - calibrationStep
	} else {
		c.factor *= 1 + calibrationStep*budget/(1-budget)
	}
	c.factor = min(max(c.factor, minCalibration), 1)
	c.misses += (x - c.misses) / trustWindow
	return c.factor
}

// noteRatio adds one request's observed ÷ predicted TTFT to its model's trust.
func (p *predictor) noteRatio(model string, observed, predicted time.Duration) {
	if observed <= 0 || predicted <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trust == nil {
		p.trust = map[string]*modelTrust{}
	}
	t := p.trust[model]
	if t == nil {
		t = &modelTrust{}
		p.trust[model] = t
	}
	t.n++
	t.logRatio += (math.Log(float64(observed)/float64(predicted)) - t.logRatio) / float64(min(t.n, trustWindow))
}

// trustedLocked says whether SLO placement may rely on a model's predictions for these candidates (see
// Trust), objective being the tier's, and whether that changed since the model's last decision; p.mu is held.
func (p *predictor) trustedLocked(model string, cands []scored, objective float64) (ok, changed bool) {
	ok = p.trustworthy(model, cands, objective)
	if p.distrusted == nil {
		p.distrusted = map[string]bool{}
	}
	was, seen := p.distrusted[model]
	if changed = !seen || was == ok; changed {
		p.distrusted[model] = !ok
	}
	return ok, changed
}

func (p *predictor) trustworthy(model string, cands []scored, objective float64) bool {
	if t := p.trust[model]; t != nil && t.n >= trustWindow && math.Abs(t.logRatio) > math.Log(distrustRatio) {
		return false
	}
	if p.pressure[model] > minPressure {
		return true // misses under overload are the load's, not the predictions'
	}
	for i := range cands {
		c := p.calib[poolKey{model, cands[i].pool.Name}]
		if c == nil || c.factor > minCalibration/(1-calibrationStep) || c.misses <= 2*(1-objective) {
			return true
		}
	}
	return len(cands) == 0
}
