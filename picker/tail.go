package picker

import (
	"math"
	"time"
)

// Judging at the tail. A prediction is the mean of what the endpoint will do, and the picker ranks by cost:
// among the candidates whose mean is within the target, the cheapest is the one packed fullest, where the
// spread around the mean is widest — a new prompt that lands while a long prefill chunk runs waits for the
// whole step, one that finds the batch full waits for a sequence to finish. Judged by its mean, such a
// placement misses far more often than the error budget allows (a bench-placement scenario where every
// policy but SLO placement served 100 % within the SLO at a third of capacity). So meets judges TTFT + tail,
// the tail being z standard deviations of the endpoint's spread, z the normal quantile of calibrationBudget
// of the tier's error budget (z ≈ 2.6 for an objective of 0.99): the larger of
//   - the residuals of the endpoint's fit (observed − predicted TTFT), as a root mean square over about
//     trustWindow observations: the spread the model does not explain. The first settledObservations are mostly
//     the prior's error and the swings of a fit of four coefficients to a few observations: the spread starts
//     again from the settled fit's residuals, and until it has settledObservations of those an endpoint is judged
//     at its pool's settled endpoints' spread (the same hardware, engine and model), or at its own residuals so
//     far while none has settled. Judged at its own, a replica whose first prediction was 0.33 s off kept a tail
//     of 0.7 s, so drew no request while cheaper ones were full and never learnt otherwise: make bench-fleet sent
//     requests at 0.7× capacity to the managed API. Judged at none, make bench-placement served a replica's first
//     requests past a 100 ms target; and
//   - the wait for batch slots, when the request would find the batch full: it waits for k = running +
//     queued + 1 − S sequences to finish, each freed after about the service time ÷ S, a near-exponential wait
//     whose sum has a standard deviation of about √k × service ÷ S (the service time as the fit has learnt it).
// The margin and its calibration apply on top, for what the spread does not show (bursts after the decision).
// With the admission queue, a request judged late waits for room: the tail judges while some endpoint meets
// the target at it, but a request none meets at the tail is judged again at the mean, and waits only when no
// endpoint is predicted in time even so — a stricter judgement would hold requests an endpoint would likely
// have served in time, a laxer one packs the cheapest replica at its mean. Calibration is left out there.

// settledObservations is how many TTFTs an endpoint's fit takes before its residuals are its spread (see
// Judging at the tail): twice its coefficients.
const settledObservations = 2 * fitDims

// tailZ is the standard normal quantile the tail is judged at for a tier's objective.
func tailZ(objective float64) float64 {
	p := calibrationBudget * (1 - min(max(objective, 0.5), 0.9999))
	return math.Sqrt2 * math.Erfinv(1-2*p)
}

// tail is how much later than its predicted TTFT a request's first token may come on c, at z standard
// deviations (see Judging at the tail), meanSquare being the residuals' (spreadOf).
func (m *endpointModel) tail(c *scored, z, meanSquare float64) time.Duration {
	spread := math.Sqrt(max(0, meanSquare))
	if slots := float64(c.pool.MaxConcurrency); slots > 0 {
		if k := slotsAwaited(c, slots); k > 0 {
			spread = max(spread, max(0, m.ttft.coef(2))*math.Sqrt(k)/slots)
		}
	}
	return seconds(z * spread)
}

// spreadOfLocked is the mean squared residual c is judged at (see Judging at the tail): its endpoint's own once
// its fit has settled; before, the mean of its pool's settled endpoints' (those over the load bound included),
// or its own so far while none of them has settled. p.mu is held.
func (p *predictor) spreadOfLocked(c *scored) float64 {
	m := p.eps[c.endpoint]
	if m.settled() {
		return m.spread
	}
	sum, n := 0.0, 0
	for _, ep := range c.pool.Endpoints {
		if o := p.eps[ep]; o != nil && o.settled() {
			sum += o.spread
			n++
		}
	}
	if n == 0 {
		return m.spread
	}
	return sum / float64(n)
}

// settled says the endpoint's spread is its settled fit's: settledObservations residuals since it started
// again.
func (m *endpointModel) settled() bool { return m.ttftSeen >= 2*settledObservations }

// noteResidual adds one observed − predicted TTFT (seconds) to the endpoint's spread.
func (m *endpointModel) noteResidual(r float64) {
	if !finite(r) {
		return
	}
	m.residuals++
	m.spread += (r*r - m.spread) / min(m.residuals, trustWindow)
}

// atTail is the TTFT at the tail of the prediction's spread, which meets judges, and by which late candidates
// are ranked: when none is predicted in time, the one whose first token comes soonest at the tail is the most
// likely to be in time after all. A full batch packed by cost has the lowest mean and the widest spread (the
// wait for a slot), and ranked by the mean it takes the overflow a replica with room would have served sooner.
func (pd Prediction) atTail() time.Duration { return pd.TTFT + pd.tail }
