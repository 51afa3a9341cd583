package picker

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// sloPolicy: mixedPolicy's two pools with a TTFT/TPOT target for the tier, batch sizes, and a fallback that
// takes what no endpoint can serve in time when when lists slo.
func sloPolicy(placement, when string) string {
	p := strings.Replace(mixedPolicy, "  routing: {debugScores: true}", "  routing: {debugScores: true, placement: "+placement+"}", 1)
	p = strings.Replace(p, "    pro: {}", "    pro: {slo: {ttft: 500ms, tpot: 50ms}}", 1)
	p = strings.Replace(p, "when: [saturated]", "when: ["+when+"], pricing: {inputPerMTok: 0.9, outputPerMTok: 0.9}", 1)
	p = strings.ReplaceAll(p, "engine: vllm, endpoints", "engine: vllm, maxConcurrency: 16, endpoints")
	return p
}

func proTenant(snap *policies.Snapshot) *policies.Tenant { t, _ := snap.Tenant("pro"); return t }

func TestFitLearnsAnAffineModel(t *testing.T) {
	f := newFit(0.025, 1, 0, 0)
	if got := f.predict([fitDims]float64{1, 0.1, 0, 0.5}); math.Abs(got-0.125) > 1e-9 {
		t.Fatalf("no data: predicted %v, want the prior 0.125", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		x := [fitDims]float64{1, rng.Float64(), rng.Float64() * 2, rng.Float64()}
		f.observe(x, 0.05+3*x[1]+0.4*x[2]+0.02*x[3]+rng.NormFloat64()*0.001)
	}
	for _, x := range [][fitDims]float64{{1, 0, 0, 0}, {1, 0.5, 1, 0.5}, {1, 1, 2, 1}} {
		want := 0.05 + 3*x[1] + 0.4*x[2] + 0.02*x[3]
		if got := f.predict(x); math.Abs(got-want) > 0.03 {
			t.Errorf("predict(%v) = %.4f, want %.4f", x, got, want)
		}
	}
	f.observe([fitDims]float64{1, 0, 0, 0}, math.Inf(1)) // ignored
	if got := f.predict([fitDims]float64{1, 0, 0, 0}); math.IsInf(got, 0) || math.IsNaN(got) {
		t.Fatalf("an infinite observation broke the fit: %v", got)
	}
}

func TestSLOPlacementPrefersTheCheapestThatMeetsTheTarget(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	tenant := proTenant(snap)
	in := Input{Tenant: tenant, Model: m, Request: request(t, strings.Repeat("sys ", 200), "q")}
	d, err := newMixedPicker(idleEngines(nil)).Pick(snap, in)
	if err != nil {
		t.Fatal(err)
	}
	if d.Pool.Name != "cheap" {
		t.Fatalf("idle fleet: chose pool %s, want the cheaper L40S that meets 500 ms", d.Pool.Name)
	}
	if d.Predicted.TTFT <= 0 || d.Predicted.TTFT > 400*time.Millisecond || d.Predicted.CostUSD <= 0 {
		t.Fatalf("prediction %+v: want a TTFT within the 0.8 margin and a cost", d.Predicted)
	}
	// The same request under affinity placement ranks by the prefill scorer: the faster H200.
	snapA, mA := modelOf(t, sloPolicy(policies.PlacementAffinity, policies.WhenSaturated))
	d, err = newMixedPicker(idleEngines(nil)).Pick(snapA, Input{Tenant: proTenant(snapA), Model: mA, Request: in.Request})
	if err != nil || d.Pool.Name != "fast" {
		t.Fatalf("affinity placement chose %v (%v), want the fast pool", d.Pool, err)
	}
	if d.Predicted.set {
		t.Fatal("affinity placement predicted")
	}
}

func TestSLOPlacementLeavesAnEndpointPredictedLate(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	// The cheap pool's batches are full and requests wait: two batch turnovers of ~3.4 s each.
	eng := idleEngines(func(ep string, e *fleet.EngineMetrics) {
		if strings.HasPrefix(ep, "10.0.1.") {
			e.Running, e.Waiting = 16, 5
		}
	})
	d, err := newMixedPicker(eng).Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Pool.Name != "fast" {
		t.Fatalf("chose %s with the cheap pool predicted late; scores %+v", d.Pool.Name, d.Scores)
	}
	for _, s := range d.Scores {
		if late := strings.HasPrefix(s.Endpoint, "10.0.1."); late == s.MeetsSLO {
			t.Errorf("%s: meets=%v with predicted TTFT %v", s.Endpoint, s.MeetsSLO, s.TTFT)
		}
	}
}

func TestSLOPlacementWhenNoneMeetsTheTarget(t *testing.T) {
	everyoneBusy := idleEngines(func(ep string, e *fleet.EngineMetrics) {
		e.Running, e.Waiting = 16, 12
		if strings.HasPrefix(ep, "10.0.0.") {
			e.Waiting = 8 // the H200s are late too, but less
		}
	})
	for _, tc := range []struct {
		when         string
		wantFallback bool
	}{
		{policies.WhenSaturated, false},                          // the fallback is only for saturation: the fastest predicted
		{policies.WhenSaturated + ", " + policies.WhenSLO, true}, // the fallback takes what no endpoint serves in time
	} {
		snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, tc.when))
		d, err := newMixedPicker(everyoneBusy).Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Fallback != nil; got != tc.wantFallback {
			t.Fatalf("when [%s]: fallback %v, want %v", tc.when, got, tc.wantFallback)
		}
		if tc.wantFallback {
			if d.Predicted.CostUSD <= 0 {
				t.Errorf("managed decision without the provider's cost: %+v", d.Predicted)
			}
			continue
		}
		if d.Pool.Name != "fast" {
			t.Errorf("when [%s]: chose %s, want the fastest predicted (fast)", tc.when, d.Pool.Name)
		}
	}
}

func TestSLOPlacementKeepsPrefixAffinity(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	sys := strings.Repeat("A long shared system prompt. ", 60)
	first, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, sys, "q1")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		d, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, sys, "q"+string(rune('2'+i)))})
		if err != nil {
			t.Fatal(err)
		}
		if d.Endpoints[0] != first.Endpoints[0] {
			t.Fatalf("request %d went to %s, away from its prefix on %s; scores %+v", i, d.Endpoints[0], first.Endpoints[0], d.Scores)
		}
		if d.Scores[0].CostUSD >= d.Scores[1].CostUSD && d.Scores[1].Endpoint[:8] == d.Scores[0].Endpoint[:8] {
			t.Errorf("the endpoint holding the prefix is not cheaper than its pool twin: %+v", d.Scores)
		}
	}
}

func TestTTFTPredictionLearnsFromObservations(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, strings.Repeat("x", 4000), "q")}
	d, err := p.Pick(snap, in)
	if err != nil {
		t.Fatal(err)
	}
	prior := d.Predicted.TTFT
	// The endpoint really takes three times the prior, and its decoding runs at 40 ms per token.
	for range 200 {
		p.ObserveTiming(m.Name, d, 3*prior, 40*time.Millisecond)
	}
	learnt := func() time.Duration { // the endpoint's prediction for the first request's features
		p.pred.mu.Lock()
		defer p.pred.mu.Unlock()
		return seconds(p.pred.model(d.Endpoints[0], 0, 0, 0).ttft.predict(d.Predicted.ttftX))
	}
	if ratio := float64(learnt()) / float64(3*prior); ratio < 0.95 || ratio > 1.05 {
		t.Fatalf("after 200 observations predicted %v for an observed %v (ratio %.2f)", learnt(), 3*prior, ratio)
	}
	again, _ := p.Pick(snap, in)
	if again.Endpoints[0] != d.Endpoints[0] {
		t.Fatalf("the second request left its prefix on %s for %s", d.Endpoints[0], again.Endpoints[0])
	}
	if tp := again.Predicted.TPOT; tp < 36*time.Millisecond || tp > 44*time.Millisecond {
		t.Fatalf("predicted TPOT %v, want about 40ms", tp)
	}
	// A request Envoy retried elsewhere teaches nothing.
	moved := again
	moved.ServedBy = "10.0.0.9:1"
	for range 100 {
		p.ObserveTiming(m.Name, moved, 100*prior, 0)
	}
	if got := learnt(); got > 4*prior {
		t.Fatalf("a retried request's timing moved the prediction to %v", got)
	}
}

func TestDebugScoresShowPredictionsAndCost(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	d, err := newMixedPicker(idleEngines(nil)).Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Scores) != 4 {
		t.Fatalf("%d scores, want 4", len(d.Scores))
	}
	for _, s := range d.Scores {
		if s.TTFT <= 0 || s.CostUSD <= 0 || !s.MeetsSLO {
			t.Errorf("%s: %+v, want a predicted TTFT, a cost and meets on an idle fleet", s.Endpoint, s)
		}
	}
	cheap, dear := d.Scores[0], d.Scores[len(d.Scores)-1]
	if cheap.CostUSD >= dear.CostUSD {
		t.Errorf("first candidate costs %v, last %v: want the cheapest first", cheap.CostUSD, dear.CostUSD)
	}
}

// A replica whose batch has room serves a request's tokens in steps it runs anyway; an idle one would run
// them for that request alone. SLO placement fills the first before it wakes the second, and spills once the
// first is predicted late.
func TestSLOPlacementFillsAReplicaBeforeWakingAnother(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	for _, tc := range []struct {
		name                string
		running, waiting    float64 // of 10.0.1.1, the busy cheap replica; its twin 10.0.1.2 is idle
		want                string
		busyCheaperThanIdle bool
	}{
		{"a few running", 3, 0, "10.0.1.1:1", true},
		{"far above its pool's mean, room in the batch", 12, 0, "10.0.1.1:1", true},
		{"full batch and a queue: predicted late", 16, 6, "10.0.1.2:1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := idleEngines(func(ep string, e *fleet.EngineMetrics) {
				if ep == "10.0.1.1:1" {
					e.Running, e.Waiting = tc.running, tc.waiting
				}
			})
			d, err := newMixedPicker(eng).Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, "distinct "+tc.name, "q")})
			if err != nil {
				t.Fatal(err)
			}
			if d.Endpoints[0] != tc.want {
				t.Fatalf("chose %s, want %s; scores %+v", d.Endpoints[0], tc.want, d.Scores)
			}
			cost := map[string]float64{}
			for _, s := range d.Scores {
				cost[s.Endpoint] = s.CostUSD
			}
			if busy, idle := cost["10.0.1.1:1"], cost["10.0.1.2:1"]; tc.busyCheaperThanIdle && !(busy > 0 && busy < idle) {
				t.Errorf("the busy replica costs %v, its idle twin %v: want the busy one cheaper", busy, idle)
			}
		})
	}
}

func TestDecodeShare(t *testing.T) {
	pool := &policies.Pool{MaxConcurrency: 16}
	speed := policies.PoolSpeed{DecodeTokensPerSecond: 1600}
	full := 1.0 / 1600
	for _, tc := range []struct {
		name string
		c    scored
		want float64
	}{
		{"idle: the whole step", scored{pool: pool, speed: speed}, 16 * full},
		{"joins three", scored{pool: pool, speed: speed, running: 2, since: 1}, 4 * full},
		{"full batch", scored{pool: pool, speed: speed, running: 15}, full},
		{"past a full batch", scored{pool: pool, speed: speed, running: 16, queue: 9}, full},
		{"no batch size stated", scored{pool: &policies.Pool{}, speed: speed}, full},
		{"stale negative counts", scored{pool: pool, speed: speed, running: -3}, 16 * full},
	} {
		if got := decodeShare(&tc.c); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// With the admission queue, a request no endpoint is predicted to serve in time waits for one that will (it is
// reported saturated) when waiting can help; otherwise it goes to the fastest at once, or to a fallback whose
// when lists slo.
func TestSLOPlacementWaitsForATimelyEndpoint(t *testing.T) {
	everyoneBusy := idleEngines(func(ep string, e *fleet.EngineMetrics) { e.Running, e.Waiting = 16, 12 })
	short, long := request(t, "sys", "q"), request(t, strings.Repeat("sys ", 12000), "q")
	for _, tc := range []struct {
		name     string
		when     string
		eng      engines
		req      *openai.Request
		queueing bool
		waited   time.Duration
		want     string // "wait", "fallback", "cheap", "fastest late" (the fast pool), "late" (either pool)
	}{
		{"late everywhere, queueing", policies.WhenSaturated, everyoneBusy, short, true, 0, "wait"},
		{"late everywhere, no queue", policies.WhenSaturated, everyoneBusy, short, false, 0, "fastest late"},
		{"late everywhere, fallback for slo", policies.WhenSaturated + ", " + policies.WhenSLO, everyoneBusy, short, true, 0, "fallback"},
		{"too long for the target even idle", policies.WhenSaturated, everyoneBusy, long, true, 0, "fastest late"},
		{"idle fleet", policies.WhenSaturated, idleEngines(nil), short, true, 0, "cheap"},
		{"idle fleet, most of the target waited", policies.WhenSaturated, idleEngines(nil), short, true, 300 * time.Millisecond, "cheap"},
		{"idle fleet, the target waited out", policies.WhenSaturated, idleEngines(nil), short, true, 490 * time.Millisecond, "late"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, tc.when))
			in := Input{Tenant: proTenant(snap), Model: m, Request: tc.req, Queueing: tc.queueing, Waited: tc.waited}
			d, err := newMixedPicker(tc.eng).Pick(snap, in)
			if tc.want == "wait" {
				var nc *NoCapacity
				if !errors.As(err, &nc) || !nc.Saturated {
					t.Fatalf("got %+v, %v; want a saturated NoCapacity for the queue", d, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "fallback":
				if d.Fallback == nil {
					t.Fatalf("went to %v, want the fallback", d.Endpoints)
				}
			case d.Fallback != nil:
				t.Fatalf("went to the fallback, want %s", tc.want)
			case tc.want == "fastest late" || tc.want == "late":
				for _, s := range d.Scores {
					if s.MeetsSLO {
						t.Errorf("%s meets the target (predicted %v), want every endpoint late", s.Endpoint, s.TTFT)
					}
				}
				if tc.want == "fastest late" && d.Pool.Name != "fast" {
					t.Errorf("chose %s, want the faster pool", d.Pool.Name)
				}
			default:
				if d.Pool.Name != tc.want {
					t.Errorf("chose %s, want %s", d.Pool.Name, tc.want)
				}
			}
		})
	}
}

// Whatever the fit learns — here a run of impossibly fast observations — a prediction never promises a
// prefill faster than the pool's stated speed: the uncached prompt at prefillTokensPerSecond is its floor.
func TestSLOPredictionNeverBeatsThePrefillSpeed(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(nil))
	in := func(i int) Input {
		return Input{Tenant: proTenant(snap), Model: m, Request: request(t, strings.Repeat(fmt.Sprintf("doc%d ", i), 3000), "q")}
	}
	for i := range 300 {
		d, err := p.Pick(snap, in(i))
		if err != nil {
			t.Fatal(err)
		}
		p.ObserveTiming("m", d, time.Millisecond, 0)
	}
	d, err := p.Pick(snap, in(-1))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Scores {
		speed := 24000.0 // h200
		if strings.HasPrefix(s.Endpoint, "10.0.1.") {
			speed = 7000 // l40s
		}
		floor := time.Duration(float64(d.EstimatedPromptTokens) / speed * float64(time.Second) * 0.9)
		if s.TTFT < floor {
			t.Errorf("%s: predicted %v for an uncached prompt of ~%d tokens, below its prefill time %v", s.Endpoint, s.TTFT, d.EstimatedPromptTokens, floor)
		}
	}
}

func TestFitExtrapolatesAGuardedFeatureAtTheSteeperSlope(t *testing.T) {
	for _, tc := range []struct {
		name         string
		guard        int
		slope, prior float64
		want         float64 // at x = 4, having seen x ≤ 1
	}{
		{"learnt flatter than the prior: the prior's slope past 1", 1, 0.2, 1, 0.05 + 0.2*1 + 1*3},
		{"learnt steeper than the prior: its own slope", 1, 3, 1, 0.05 + 3*4},
		{"not guarded: its own slope", 0, 0.2, 1, 0.05 + 0.2*4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFit(0, tc.prior).guarded(tc.guard)
			rng := rand.New(rand.NewPCG(3, 4))
			for range 400 {
				x := [fitDims]float64{1, rng.Float64()}
				f.observe(x, 0.05+tc.slope*x[1])
			}
			if got, want := f.predict([fitDims]float64{1, 0.5}), 0.05+tc.slope*0.5; math.Abs(got-want) > 0.01 {
				t.Errorf("inside the observed range: predict = %.4f, want %.4f", got, want)
			}
			if got := f.predict([fitDims]float64{1, 4}); math.Abs(got-tc.want) > 0.05 {
				t.Errorf("past the observed range: predict = %.4f, want %.4f", got, tc.want)
			}
		})
	}
}

// The prefill share is the uncached tokens of the sends to an endpoint within the last prefillWindow, their first
// token out or not, at its prefill speed, over the window (over the span of the sends remembered when all of
// them fall within it), at most maxPrefillShare; a split's booking at its decoder does not count.
func TestPrefillShare(t *testing.T) {
	now := time.Unix(1000, 0)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	full := make([]sentPrompt, recentSends) // every remembered send within the window, the oldest 4 s ago
	for i := range full {
		full[i] = sentPrompt{at: ago(time.Duration(i+1) * 4 * time.Second / recentSends), uncached: 1000}
	}
	cases := []struct {
		name  string
		sends []sentPrompt
		want  float64
	}{
		{"nothing sent", nil, 0},
		{"two long prompts within the window", []sentPrompt{{at: ago(time.Second), uncached: 30000}, {at: ago(5 * time.Second), uncached: 20000}}, 0.5},
		{"one past the window", []sentPrompt{{at: ago(time.Second), uncached: 30000}, {at: ago(11 * time.Second), uncached: 20000}}, 0.3},
		{"one with its first token out", []sentPrompt{{at: ago(time.Second), firstBy: now.Add(time.Second), uncached: 30000},
			{at: ago(2 * time.Second), firstBy: now.Add(time.Second), uncached: 20000}}, 0.5},
		{"a split's booking at its decoder", []sentPrompt{{at: ago(time.Second), uncached: 30000}, {at: ago(2 * time.Second), uncached: 20000, remote: true}}, 0.3},
		{"more than the engine can prefill", []sentPrompt{{at: ago(time.Second), uncached: 500000}}, maxPrefillShare},
		// 32 sends of 1,000 tokens in 4 s at 10,000 a second: 0.8 of the engine's time, not 0.32 over 10 s.
		{"every remembered send within the window", full, 0.8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m endpointModel
			copy(m.recent[:], tc.sends)
			if tc.name == "one with its first token out" {
				m.forgetSend(Prediction{sentAt: ago(2 * time.Second), uncached: 20000})
				if got := m.aheadTokens(&scored{}, 0, now); got != 30000 {
					t.Errorf("%.0f tokens still in prefill, want the other send's 30000", got)
				}
			}
			if got := m.prefillShare(10000, now); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("share %.3f, want %.3f", got, tc.want)
			}
		})
	}
}

// A prefill added to an endpoint's share slows its decodes by the share it takes of the window: the decode step
// over 1 − (the share + the prefill's).
func TestTPOTWithPrefill(t *testing.T) {
	pd := Prediction{tpotStep: 30 * time.Millisecond, prefillShare: 0.5}
	cases := []struct {
		tokens float64
		want   time.Duration
	}{
		{0, 60 * time.Millisecond},
		{25000, 120 * time.Millisecond}, // 2.5 s of a 10 s window at 10,000 tokens a second: 30 ms ÷ 0.25
		{1e9, 300 * time.Millisecond},   // bounded at maxPrefillShare: 30 ms ÷ 0.1
	}
	for _, tc := range cases {
		if got := tpotWithPrefill(pd, tc.tokens, 10000); got < tc.want-time.Microsecond || got > tc.want+time.Microsecond {
			t.Errorf("%.0f tokens more: TPOT %v, want %v", tc.tokens, got, tc.want)
		}
	}
}

// A replica with long prompts to prefill decodes slowly until they are done (chunked prefill: its steps carry
// the prefill): before it has shown otherwise, SLO placement predicts its TPOT over 1 − the prefill share. It
// learns from the TPOTs observed at the share their requests were sent at how much the share costs them: all
// of it where prefill kept coming while they decoded, nothing where it was done before they began.
func TestTPOTPredictionCountsThePrefillShare(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	now := time.Unix(1000, 0)
	p := newMixedPicker(idleEngines(nil))
	p.Now = func() time.Time { return now }
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
	tpots := func() map[string]time.Duration {
		d, err := p.Pick(snap, in)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Duration{}
		for _, s := range d.Scores {
			out[s.Endpoint] = s.TPOT
		}
		return out
	}
	before := tpots()
	// 10.0.0.1 (an H200, 24,000 tokens a second) has 120,000 uncached tokens sent in the last 10 s still to
	// prefill: half of its next 10 s.
	p.pred.mu.Lock()
	for i := range 4 {
		p.pred.model("10.0.0.1:1", 0, 0, 0).recent[i] = sentPrompt{at: now.Add(-time.Duration(i+1) * time.Second), uncached: 30000}
	}
	p.pred.mu.Unlock()
	after := tpots()
	if got, want := after["10.0.0.1:1"], 2*before["10.0.0.1:1"]; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Errorf("10.0.0.1 prefilling half its time: predicted TPOT %v, want twice its %v", got, before["10.0.0.1:1"])
	}
	if before["10.0.0.1:1"] <= 0 {
		t.Fatalf("no TPOT predicted for 10.0.0.1: %v", before)
	}
	if d := after["10.0.0.2:1"] - before["10.0.0.2:1"]; d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("its twin 10.0.0.2 moved from %v to %v", before["10.0.0.2:1"], after["10.0.0.2:1"])
	}
	for _, tc := range []struct {
		name             string
		idle, share      time.Duration // TPOTs observed of requests sent at a share of 0 and of 0.5
		wantIdle, wantAt time.Duration // then predicted idle and at a share of 0.5
	}{
		{"the share slows decodes", 30 * time.Millisecond, 60 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond},
		{"prefill done before they decode", 40 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond, 40 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMixedPicker(idleEngines(nil))
			p.Now = func() time.Time { return now }
			if _, err := p.Pick(snap, in); err != nil { // the endpoints' models, with their priors
				t.Fatal(err)
			}
			for i := range 200 {
				share, tpot := 0.0, tc.idle
				if i%2 == 1 {
					share, tpot = 0.5, tc.share
				}
				pd := Prediction{set: true, prefillShare: share, tpotX: tpotFeatures(0, share)}
				p.ObserveTiming(m.Name, Decision{Endpoints: []string{"10.0.0.1:1"}, Predicted: pd}, 0, tpot)
			}
			p.pred.mu.Lock()
			fit := p.pred.eps["10.0.0.1:1"].tpot
			p.pred.mu.Unlock()
			for _, at := range []struct {
				share float64
				want  time.Duration
			}{{0, tc.wantIdle}, {0.5, tc.wantAt}} {
				if got := seconds(fit.predict(tpotFeatures(0, at.share))); got < at.want-time.Millisecond || got > at.want+time.Millisecond {
					t.Errorf("at a share of %g: predicted %v, want %v", at.share, got, at.want)
				}
			}
		})
	}
}

// Before an endpoint has reported a TPOT its prior, from the pool's batch size, is the decode step over 1 − the
// prefill share at any running batch; a share's slope fitted below 0 never predicts a busier endpoint faster;
// without a batch size the share has no prior, and costs what the TPOTs show.
func TestTPOTOverTheShare(t *testing.T) {
	t.Run("prior", func(t *testing.T) {
		var p predictor
		m := p.model("e", 0, 0.05, 64) // a 50 ms step at a full batch of 64
		for _, running := range []float64{0, 16, 64} {
			step := m.tpot.predict(tpotFeatures(running, 0))
			for _, share := range []float64{0.25, 0.5, 0.9} {
				if got, want := m.tpot.predict(tpotFeatures(running, share)), step/(1-share); math.Abs(got-want) > 1e-9 {
					t.Errorf("running %g, share %g: %.4f s, want the step %.4f ÷ (1 − share) = %.4f", running, share, got, step, want)
				}
			}
		}
	})
	observe := func(p *predictor, share float64, tpot time.Duration) {
		p.observe("e", Prediction{tpotX: tpotFeatures(8, share)}, 0, tpot)
	}
	t.Run("never faster for the share", func(t *testing.T) {
		var p predictor
		p.model("e", 0, 0.05, 64)
		for i := range 200 { // TPOT falling as the share rises: noise
			share := float64(i%5) / 10
			observe(&p, share, time.Duration((40-20*share)*float64(time.Millisecond)))
		}
		pd := p.eps["e"]
		step := pd.tpot.predict(tpotFeatures(8, 0))
		c := &scored{endpoint: "e", running: 8, pool: &policies.Pool{MaxConcurrency: 64}, speed: policies.PoolSpeed{PrefillTokensPerSecond: 10000, DecodeTokensPerSecond: 1280}}
		pd.recent[0] = sentPrompt{at: time.Unix(1000, 0), uncached: 40000} // a share of 0.4
		p.predictLocked(c, &prompt{tokens: 100, blockTokens: 16, scale: 1}, 100, 0, time.Unix(1000, 0))
		if c.pred.prefillShare < 0.3 || c.pred.TPOT < seconds(step) {
			t.Errorf("share %.2f: TPOT %v, below the step %v", c.pred.prefillShare, c.pred.TPOT, seconds(step))
		}
	})
	t.Run("no batch size: what the TPOTs show", func(t *testing.T) {
		var p predictor
		p.model("e", 0, 0, 0)
		for i := range 200 { // 40 ms whatever the share, at shares up to 0.2
			observe(&p, float64(i%3)/10, 40*time.Millisecond)
		}
		for _, share := range []float64{0.2, 0.8} {
			if got := p.eps["e"].tpot.predict(tpotFeatures(8, share)); math.Abs(got-0.04) > 0.002 {
				t.Errorf("at a share of %g: %.4f s, want 0.040", share, got)
			}
		}
	})
}
