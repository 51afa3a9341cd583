package picker

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
)

func TestTailZFollowsTheObjective(t *testing.T) {
	tests := []struct{ objective, want float64 }{
		{0.99, 2.5758},  // calibrationBudget 0.5 of a 1 % budget: the 99.5th percentile
		{0.999, 3.2905}, // of 0.1 %: the 99.95th
		{0.9, 1.6449},   // of 10 %: the 95th
		{0.2, 0.6745},   // objectives below 0.5 are judged as 0.5: the 75th percentile
	}
	for _, tc := range tests {
		if got := tailZ(tc.objective); math.Abs(got-tc.want) > 1e-3 {
			t.Errorf("tailZ(%v) = %.4f, want %.4f", tc.objective, got, tc.want)
		}
	}
}

// An endpoint whose TTFTs stray far from its predictions is judged at the tail of that spread: a cheap pool
// whose mean prediction is well within the target, but whose TTFTs spread by 150 ms, no longer meets a 500 ms
// target (200 ms + 2.6 × 150 ms is past the 400 ms margin), and the request goes to the fast pool; debugScores
// still shows the mean. With the admission queue the tail is left out, as calibration is.
func TestNoisyPoolIsJudgedAtItsTail(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	prompts := 0
	fresh := func(queueing bool) Input {
		prompts++
		return Input{Tenant: proTenant(snap), Model: m, Queueing: queueing,
			Request: request(t, strings.Repeat(fmt.Sprintf("sys%d ", prompts), 1200), "q")}
	}
	d, err := p.Pick(snap, fresh(false))
	if err != nil || d.Pool.Name != "cheap" {
		t.Fatalf("quiet predictions: got %v (%v), want the cheap pool", d.Pool, err)
	}
	for _, ep := range []string{"10.0.1.1:1", "10.0.1.2:1"} {
		p.pred.mu.Lock()
		for i := range trustWindow * 4 {
			p.pred.model(ep, 0, 0, 0).noteResidual(0.15 * float64(1-2*(i%2)))
		}
		p.pred.mu.Unlock()
	}
	d, err = p.Pick(snap, fresh(false))
	if err != nil || d.Pool.Name != "fast" {
		t.Fatalf("noisy cheap pool: got %v (%v), want the fast pool; scores %+v", d.Pool, err, d.Scores)
	}
	for _, s := range d.Scores {
		if strings.HasPrefix(s.Endpoint, "10.0.1.") && (s.MeetsSLO || s.TTFT > 300*time.Millisecond) {
			t.Errorf("cheap endpoint %s: meets %v at a mean of %v; want judged late, its mean shown as it is", s.Endpoint, s.MeetsSLO, s.TTFT)
		}
	}
	if d, err = p.Pick(snap, fresh(true)); err != nil || d.Pool.Name != "cheap" {
		t.Fatalf("with the admission queue: got %v (%v), want the cheap pool (no tail)", d.Pool, err)
	}
}

// A request that finds the batch full waits for k sequences to finish: its tail is z × √k × service ÷ S, the
// service time as the fit holds it; with room in the batch only the residual spread counts.
func TestFullBatchWaitIsJudgedAtItsTail(t *testing.T) {
	const service, slots, z = 2.0, 16, 2.0
	m := &endpointModel{ttft: newFit(stepPrior, 1, service, 0)}
	pool := &policies.Pool{MaxConcurrency: slots}
	tests := []struct {
		name                  string
		running, queue, since float64
		residual              float64 // root mean square, seconds
		want                  time.Duration
	}{
		{"room in the batch, no residuals", 10, 0, 2, 0, 0},
		{"room in the batch, residuals", 10, 0, 2, 0.01, seconds(z * 0.01)},
		{"full, four to wait for", 16, 2, 1, 0, seconds(z * service * 2 / slots)},
		{"full, the residuals wider", 16, 0, 0, 0.5, seconds(z * 0.5)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m.spread = tc.residual * tc.residual
			c := &scored{pool: pool, running: tc.running, queue: int64(tc.queue), since: tc.since}
			if got := m.tail(c, z); absDuration(got-tc.want) > time.Microsecond {
				t.Errorf("tail %v, want %v", got, tc.want)
			}
		})
	}
}

func absDuration(d time.Duration) time.Duration { return max(d, -d) }

// The prompts sent since the engine's last reading are counted at what each left uncached, not at ū: a burst
// of new groups' uncached first prompts is a prefill queue the waiting count does not show yet.
func TestAheadTokensCountTheRecentSends(t *testing.T) {
	var p predictor
	const ep = "10.0.0.1:1"
	for _, uncached := range []float64{100, 100, 100, 1000, 2000} {
		p.sent(ep, Prediction{uncached: uncached}, "m", false, false)
	}
	m := p.eps[ep]
	mean := m.uncached
	tests := []struct {
		queue int
		since float64
		want  float64
	}{
		{0, 0, 0},
		{1, 0, mean},
		{0, 2, 2000 + 1000},
		{2, 3, 2*mean + 2000 + 1000 + 100},
		{0, recentSends + 4, 4*mean + 2000 + 1000 + 3*100}, // beyond what is remembered: ū each
	}
	for _, tc := range tests {
		c := &scored{queue: int64(tc.queue), since: tc.since}
		if got := m.aheadTokens(c, mean); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("queue %d, since %v: %v tokens ahead, want %v", tc.queue, tc.since, got, tc.want)
		}
	}
}

// A pool that states its batch size predicts TPOT before its first observation: the hardware's full-batch
// step (S ÷ decodeTokensPerSecond), half of it growing with the batch, so a replica is not packed past the
// TPOT target while its first requests are still decoding.
func TestTPOTPriorFromTheBatch(t *testing.T) {
	var p predictor
	const slots = 16
	full := slots / 1200.0 // the l40s class of the test policy
	m := p.model("10.0.1.1:1", 0, full, slots)
	for _, running := range []float64{0, 8, 16} {
		want := full/2 + full/2*running/slots
		if got := m.tpot.predict([fitDims]float64{1, running / runningScale}); math.Abs(got-want) > 1e-9 {
			t.Errorf("running %v: TPOT prior %v, want %v", running, got, want)
		}
	}
	snap, mod := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	d, err := newMixedPicker(idleEngines(nil)).Pick(snap, Input{Tenant: proTenant(snap), Model: mod, Request: request(t, "sys", "q")})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Scores {
		if s.TPOT <= 0 {
			t.Errorf("%s: no TPOT predicted before observations, though its pool states its batch size", s.Endpoint)
		}
	}
}
