package picker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
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
// still shows the mean. With the admission queue the tail judges too while some endpoint meets at it; when none
// does (the fast pool noisy as well), the request is judged again at the mean rather than held in the queue,
// and goes to the cheap pool, in time at the mean.
func TestNoisyPoolIsJudgedAtItsTail(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	clock := fakeclock.New()
	p.Now = clock.Now
	prompts := 0
	fresh := func(queueing bool) Input {
		prompts++
		clock.Advance(time.Minute) // each request alone on the fleet: the last one's prefill is long over
		return Input{Tenant: proTenant(snap), Model: m, Queueing: queueing,
			Request: request(t, strings.Repeat(fmt.Sprintf("sys%d ", prompts), 1200), "q")}
	}
	d, err := p.Pick(snap, fresh(false))
	if err != nil || d.Pool.Name != "cheap" {
		t.Fatalf("quiet predictions: got %v (%v), want the cheap pool", d.Pool, err)
	}
	noisy(p, "10.0.1.1:1", "10.0.1.2:1")
	d, err = p.Pick(snap, fresh(false))
	if err != nil || d.Pool.Name != "fast" {
		t.Fatalf("noisy cheap pool: got %v (%v), want the fast pool; scores %+v", d.Pool, err, d.Scores)
	}
	for _, s := range d.Scores {
		if strings.HasPrefix(s.Endpoint, "10.0.1.") && (s.MeetsSLO || s.TTFT > 300*time.Millisecond) {
			t.Errorf("cheap endpoint %s: meets %v at a mean of %v; want judged late, its mean shown as it is", s.Endpoint, s.MeetsSLO, s.TTFT)
		}
	}
	if d, err = p.Pick(snap, fresh(true)); err != nil || d.Pool.Name != "fast" {
		t.Fatalf("with the admission queue: got %v (%v), want the fast pool, in time at its tail", d.Pool, err)
	}
	noisy(p, "10.0.0.1:1", "10.0.0.2:1")
	if d, err = p.Pick(snap, fresh(true)); err != nil || d.Pool.Name != "cheap" || !d.Predicted.inTime {
		t.Fatalf("with the admission queue, every pool noisy: got %v (%v), in time %v; want the cheap pool, in time at the mean",
			d.Pool, err, d.Predicted.inTime)
	}
}

// noisy gives endpoints TTFT residuals of ±150 ms, over many observations.
func noisy(p *Affinity, endpoints ...string) {
	p.pred.mu.Lock()
	defer p.pred.mu.Unlock()
	for _, ep := range endpoints {
		for i := range trustWindow * 4 {
			p.pred.model(ep, 0, 0, 0).noteResidual(0.15 * float64(1-2*(i%2)))
		}
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
			c := &scored{pool: pool, running: tc.running, queue: int64(tc.queue), since: tc.since}
			if got := m.tail(c, z, tc.residual*tc.residual); absDuration(got-tc.want) > time.Microsecond {
				t.Errorf("tail %v, want %v", got, tc.want)
			}
		})
	}
}

func absDuration(d time.Duration) time.Duration { return max(d, -d) }

// The prefill ahead of a request counts this gateway's sends at what each left uncached, until the tail of
// its predicted first token: those since the engine's reading on top of the queue it reports (whatever
// finished since, which left the running batch, not the prefill queue), and those the reading shows running
// though still in prefill. A burst of new groups' uncached first prompts is a prefill queue the waiting count
// does not show.
func TestAheadTokensCountTheSendsStillInPrefill(t *testing.T) {
	var p predictor
	const ep = "10.0.0.1:1"
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for i, uncached := range []float64{100, 100, 100, 1000, 2000} {
		// each sent 10 ms after the last, its first token due 100 ms after it was sent
		p.sent(ep, Prediction{uncached: uncached, TTFT: 80 * time.Millisecond, tail: 20 * time.Millisecond, sentAt: at(10 * i)}, "m", false, false)
	}
	m := p.eps[ep]
	mean := m.uncached
	tests := []struct {
		name            string
		queue, readAtMs int
		nowMs           int
		want            float64
	}{
		{"every send in prefill, the last two since the reading", 1, 25, 45, max(mean+3000, 3300)},
		{"the first three past their first token", 1, 25, 125, mean + 3000},
		{"one left", 3, 25, 135, 3*mean + 2000},
		{"none left: the reading's queue", 2, 25, 150, 2 * mean},
		{"the reading's queue is the sends still waiting: counted once", 2, 50, 60, 3300},
		{"no reading and nothing sent in prefill", 0, 0, 500, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &scored{queue: int64(tc.queue), readAt: at(tc.readAtMs)}
			if got := m.aheadTokens(c, mean, at(tc.nowMs)); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("%v tokens ahead, want %v", got, tc.want)
			}
		})
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

// An endpoint that has only run small batches, at a TPOT that did not grow with them, still predicts a full
// batch slower than a small one: past the largest batch observed, TPOT grows at least at the prior's slope.
// A P/D decoder between bursts is such an endpoint, and taking a burst's decodes as free broke its TPOT.
func TestTPOTPastTheLargestBatchObserved(t *testing.T) {
	var p predictor
	const slots = 16
	full := slots / 1200.0
	m := p.model("10.0.1.1:1", 0, full, slots)
	for i := range 300 {
		running := float64(1 + i%3) // batches of 1-3
		m.tpot.observe([fitDims]float64{1, running / runningScale}, 0.02)
	}
	small := m.tpot.predict([fitDims]float64{1, 3 / runningScale})
	if math.Abs(small-0.02) > 0.002 {
		t.Fatalf("within the batches observed: TPOT %v, want the 0.02 observed", small)
	}
	got := m.tpot.predict([fitDims]float64{1, slots / runningScale})
	if want := small + full/2*(slots-3)/slots; got < want-1e-6 {
		t.Errorf("a full batch, having run at most 3: TPOT %v, want at least %v (the prior's slope past 3)", got, want)
	}
}

// When none is predicted in time, the late candidates are ranked by their TTFT at the tail, not by the mean: a
// full batch packed by cost has the lowest mean and the widest spread (the wait for a slot), and the replica
// with room is the likelier to serve the request in time. The meeting ones still come first, cheapest first.
func TestLateCandidatesAreRankedAtTheirTail(t *testing.T) {
	ms := time.Millisecond
	cands := []scored{
		{endpoint: "full batch", pred: Prediction{TTFT: 480 * ms, tail: 700 * ms, CostUSD: 1}},
		{endpoint: "room", pred: Prediction{TTFT: 420 * ms, tail: 120 * ms, CostUSD: 3}},
		{endpoint: "queue", pred: Prediction{TTFT: 600 * ms, tail: 10 * ms, CostUSD: 2}},
		{endpoint: "meets, dear", meets: true, pred: Prediction{TTFT: 100 * ms, CostUSD: 9}},
		{endpoint: "meets, cheap", meets: true, pred: Prediction{TTFT: 300 * ms, CostUSD: 4}},
	}
	rankBySLO(cands, false)
	got := endpointsOf(cands)
	want := []string{"meets, cheap", "meets, dear", "room", "queue", "full batch"}
	if !slices.Equal(got, want) {
		t.Errorf("ranked %q, want %q", got, want)
	}
}

// endpointsOf is the candidates' endpoints in their order.
func endpointsOf(cands []scored) []string {
	names := make([]string, len(cands))
	for i, c := range cands {
		names[i] = c.endpoint
	}
	return names
}

// Among late candidates, those that would decode within the TPOT target come first, however fast the first
// token elsewhere: a request predicted late often makes its first token, and then a packed batch's TPOT loses
// it.
func TestLateCandidatesThatDecodeInTimeComeFirst(t *testing.T) {
	ms := time.Millisecond
	late := func(name string, ttft, tpot time.Duration) scored {
		return scored{endpoint: name, pred: Prediction{TTFT: ttft, TPOT: tpot, tpotLimit: 80 * ms}}
	}
	cands := []scored{
		late("packed, fastest", 500*ms, 95*ms),
		late("room, slower", 560*ms, 60*ms),
		late("room, slowest", 900*ms, 70*ms),
		late("packed, slow", 600*ms, 120*ms),
		{endpoint: "no TPOT target", pred: Prediction{TTFT: 700 * ms, TPOT: 200 * ms}},
	}
	rankBySLO(cands, false)
	got := endpointsOf(cands)
	want := []string{"room, slower", "no TPOT target", "room, slowest", "packed, fastest", "packed, slow"}
	if !slices.Equal(got, want) {
		t.Errorf("ranked %q, want %q", got, want)
	}

	// Nor does the band of the fastest, placed by affinity and load, take in one that would decode late.
	band := []scored{late("room", 500*ms, 60*ms), late("packed, warm", 520*ms, 95*ms)}
	band[0].total, band[1].total = 1, 10
	rankBySLO(band, false)
	if first := (&decision{buf: &candidateLists{}}).fastest(band, band)[0].endpoint; first != "room" {
		t.Errorf("the fastest band placed %q first, want room: a warmer prefix does not buy a late TPOT", first)
	}
}

// A request whose first token came, or that finished, is no longer in prefill, whenever its first token was
// due: prefilled and observe forget its send.
func TestObservedSendLeavesThePrefillAhead(t *testing.T) {
	var p predictor
	const ep = "10.0.0.1:1"
	now := time.Unix(1_700_000_000, 0)
	first := Prediction{uncached: 1000, TTFT: time.Second, sentAt: now}
	second := Prediction{uncached: 300, TTFT: time.Second, sentAt: now.Add(time.Millisecond)}
	p.sent(ep, first, "m", false, false)
	p.sent(ep, second, "m", false, false)
	m := p.eps[ep]
	c := &scored{}
	if got := m.aheadTokens(c, 0, now.Add(2*time.Millisecond)); got != 1300 {
		t.Fatalf("%v tokens ahead before either finished, want 1300", got)
	}
	p.observe(ep, first, 50*time.Millisecond, 0)
	if got := m.aheadTokens(c, 0, now.Add(2*time.Millisecond)); got != 300 {
		t.Errorf("%v tokens ahead once the first finished, want the second's 300", got)
	}
	p.prefilled(ep, second) // its first token passed the gateway (Picker.Prefilled)
	if got := m.aheadTokens(c, 0, now.Add(2*time.Millisecond)); got != 0 {
		t.Errorf("%v tokens ahead once the second's first token came, want none", got)
	}
}

// A batch below its stated size waits all the same when the engine's KV cache cannot hold the request: the
// sequences that must finish first are those whose mean share (usage ÷ running) frees what the request and
// the queue before it need beyond the free blocks.
func TestKVAwaitedCountsTheSequencesThatFreeTheBlocks(t *testing.T) {
	tests := []struct {
		name                   string
		capacity               int
		kvUtil, running, queue float64
		blocks, want           float64
	}{
		{"room to spare", 1000, 0.5, 10, 0, 100, 0},
		{"exactly the free blocks", 1000, 0.9, 30, 0, 100, 0},
		{"ten blocks short, 30 a sequence", 1000, 0.9, 30, 0, 110, 1},
		{"the queue first: one sequence's share each", 1000, 0.9, 30, 2, 100, 2},
		{"full: a hundred blocks at 25 each", 1000, 1, 40, 0, 100, 4},
		{"no usage reported", 1000, 0, 30, 0, 5000, 0},
		{"no capacity reported", 0, 0.99, 30, 0, 100, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &scored{capacity: tc.capacity, kvUtil: tc.kvUtil, running: tc.running, queue: int64(tc.queue)}
			if got := kvAwaited(c, tc.blocks); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("%v sequences awaited, want %v", got, tc.want)
			}
		})
	}
}

// A new endpoint's spread is the mean of the residuals it has had, not an average that starts from 0 and would
// judge its first requests at a fraction of their real tail; past trustWindow residuals it follows the recent
// ones.
func TestSpreadIsTheMeanUntilTheWindowFills(t *testing.T) {
	var m endpointModel
	for range 4 {
		m.noteResidual(0.1)
	}
	if math.Abs(m.spread-0.01) > 1e-12 {
		t.Fatalf("spread %v after four residuals of 0.1 s, want their mean square 0.01", m.spread)
	}
	m.noteResidual(0.2) // the fifth: the mean of five
	if want := (4*0.01 + 0.04) / 5; math.Abs(m.spread-want) > 1e-12 {
		t.Fatalf("spread %v, want %v", m.spread, want)
	}
	for range 20 * trustWindow {
		m.noteResidual(0.05)
	}
	if math.Abs(m.spread-0.0025) > 1e-6 {
		t.Errorf("spread %v after many residuals of 0.05 s, want about 0.0025", m.spread)
	}
}

// An endpoint's first TTFTs are its prior's error, which the fit corrects, not its spread: a replica whose
// prefill runs four times faster than its pool states, with TTFTs 5 ms about a line, is judged after a dozen
// requests at what its fit still misses by (its residuals since it settled), not at the first prediction's
// 0.24 s error (which counted gave it a spread of 0.09 s here, and in make bench-fleet kept such a replica from
// the requests that would have taught it otherwise).
func TestPriorErrorIsNotSpread(t *testing.T) {
	p := &predictor{}
	m := p.model("ep", 0, 0, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	const requests = settledObservations + 4
	for range requests {
		prefill := 0.1 + 0.3*rng.Float64() // seconds at the stated speed
		x := [fitDims]float64{1, prefill, 0, 0}
		observed := 0.01 + prefill/4 + 0.005*rng.NormFloat64()
		p.observe("ep", Prediction{ttftX: x}, seconds(observed), 0)
	}
	if sd := math.Sqrt(m.spread); sd > 0.05 || m.residuals != requests-settledObservations {
		t.Errorf("spread %.3f s over %v residuals, want under 0.05 s over %d", sd, m.residuals, requests-settledObservations)
	}
}

// An endpoint whose fit has not settled is judged at its pool's settled spread (an endpoint out of this
// decision's candidates, over its load bound, counts), not at its own first residuals (its prior's error) nor
// at another pool's; while none of its pool has settled, at its own so far.
func TestUnsettledEndpointTakesItsPoolsSpread(t *testing.T) {
	poolA := &policies.Pool{Name: "a", Endpoints: []string{"a1", "a2", "a3", "a4"}}
	p := &predictor{}
	endpoint := func(ep string, seen int, rms float64) {
		m := p.model(ep, 0, 0, 0)
		m.ttftSeen, m.spread = seen, rms*rms
	}
	endpoint("a1", 2*settledObservations+20, 0.01)
	endpoint("a2", 3, 0.3)
	endpoint("a3", 2*settledObservations, 0.03)   // a4 has no model yet
	endpoint("b1", 2*settledObservations+20, 0.2) // another pool's
	tests := []struct {
		name string
		c    scored
		want float64
	}{
		{"settled: its own", scored{pool: poolA, endpoint: "a1"}, 0.01 * 0.01},
		{"unsettled: the mean of its pool's settled", scored{pool: poolA, endpoint: "a2"}, (0.01*0.01 + 0.03*0.03) / 2},
	}
	for _, tc := range tests {
		if got := p.spreadOfLocked(&tc.c); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	endpoint("a1", 2, 0.01)
	endpoint("a3", 2*settledObservations-1, 0.03) // seven residuals since it started again
	if got := p.spreadOfLocked(&scored{pool: poolA, endpoint: "a2"}); math.Abs(got-0.09) > 1e-12 {
		t.Errorf("none of its pool settled: %v, want its own 0.09 (not pool b's)", got)
	}
}
