package picker

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// busyEngines: every endpoint's batch full and a backlog that makes a new request late (500 ms target); with
// saturated, the cheap pool's queues are at maxWaiting (64, the default).
func busyEngines(saturated bool) engines {
	return idleEngines(func(ep string, e *fleet.EngineMetrics) {
		e.Running, e.Waiting = 16, 12
		if saturated && strings.HasPrefix(ep, "10.0.1.") {
			e.Waiting = 64
		}
	})
}

// A fleet over its capacity: serving a request every endpoint would serve late only deepens the backlog that
// every later request waits behind, so SLO placement sends it where saturated overflow goes — the fallback for
// saturation, or a 429 — and serves at once what is late for its own prompt's sake, or late in a lone busy
// moment.
func TestSLOPlacementRefusesWhatOverloadWouldServeLate(t *testing.T) {
	short, long := request(t, "sys", "q"), request(t, strings.Repeat("sys ", 12000), "q")
	for _, tc := range []struct {
		name string
		when string
		eng  engines
		long bool
		want string // "fallback", "refused", "served"
	}{
		{"saturated pool, late elsewhere: the saturated fallback", policies.WhenSaturated, busyEngines(true), false, "fallback"},
		{"saturated pool, late elsewhere, no fallback for saturation: 429", policies.WhenUnavailable, busyEngines(true), false, "refused"},
		{"too long for the target even idle: served", policies.WhenSaturated, busyEngines(true), true, "served"},
		{"busy everywhere once, nothing saturated: served", policies.WhenUnavailable, busyEngines(false), false, "served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, tc.when))
			p := newMixedPicker(tc.eng)
			p.Metrics = NewMetrics(nil)
			req := short
			if tc.long {
				req = long
			}
			d, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: req})
			var nc *NoCapacity
			switch tc.want {
			case "fallback":
				if err != nil || d.Fallback == nil {
					t.Fatalf("got %v, %v; want the saturated fallback", d.Endpoints, err)
				}
			case "refused":
				if !errors.As(err, &nc) || !nc.Saturated {
					t.Fatalf("got %v, %v; want a saturated NoCapacity (429)", d.Endpoints, err)
				}
			case "served":
				if err != nil || d.Fallback != nil || d.Pool.Name != "fast" {
					t.Fatalf("got %+v, %v; want the fastest endpoint", d, err)
				}
			}
			overloads := testutil.ToFloat64(p.Metrics.Decisions.WithLabelValues("m", "overload"))
			if want := tc.want != "served"; (overloads == 1) != want {
				t.Errorf("overload decisions counted %v, want %v", overloads, want)
			}
		})
	}
}

// Without a saturated endpoint, overload is told by pressure: once more than minPressure of recent decisions
// found every endpoint too busy, the fleet is over its capacity and requests it would serve late are refused;
// when the fleet catches up, pressure decays and they are served again.
func TestSLOPlacementPressure(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenUnavailable))
	busy := busyEngines(false)
	p := newMixedPicker(busy)
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
	served, refusedAt := 0, -1
	for i := range 20 {
		if _, err := p.Pick(snap, in); err != nil {
			refusedAt = i
			break
		}
		served++
	}
	if served < 3 || refusedAt < 0 {
		t.Fatalf("served %d, refused at %d: want a few served in the busy moment, then refusals", served, refusedAt)
	}
	idle := idleEngines(nil)
	for ep := range busy {
		busy[ep] = idle[ep] // the fleet catches up
	}
	for range 2 * pressureWindow {
		if _, err := p.Pick(snap, in); err != nil {
			t.Fatalf("idle fleet refused: %v", err)
		}
	}
	for ep := range busy {
		busy[ep] = busyEngines(false)[ep]
	}
	if _, err := p.Pick(snap, in); err != nil {
		t.Fatalf("one busy moment after the pressure decayed was refused: %v", err)
	}
}

// A fleet whose batches would decode a request past its TPOT target on every endpoint is over its capacity
// as surely as one that would start it late: the request misses whatever its TTFT, and slows every decode of the
// batch it joins. Once pressure says so, such requests are refused; an idle fleet, which decodes in time, serves
// them all. A TPOT target no endpoint meets even alone is the model's hardware, not an overload: served.
func TestSLOPlacementRefusesWhatOverloadWouldDecodeLate(t *testing.T) {
	// The TPOT prior at half a batch is 4 ms on the fast pool (16 ÷ 3000 tokens a second, half of it fixed, half
	// growing with the batch) and 10 ms on the cheap one; alone, 2.7 ms on the fast pool.
	halfFull := func(_ string, e *fleet.EngineMetrics) { e.Running = 8 }
	for _, tc := range []struct {
		name    string
		tpot    string
		running func(string, *fleet.EngineMetrics)
		refused bool
	}{
		{"half-full batches past a 3.5 ms target: refused once pressure says so", "3500us", halfFull, true},
		{"idle batches within it: served", "3500us", nil, false},
		{"a 2 ms target, past even alone: served", "2ms", halfFull, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := strings.Replace(sloPolicy(policies.PlacementSLO, policies.WhenUnavailable), "tpot: 50ms", "tpot: "+tc.tpot, 1)
			snap, m := modelOf(t, policy)
			in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
			p := newMixedPicker(idleEngines(tc.running))
			served, refusedAt := 0, -1
			for i := range 2 * pressureWindow {
				d, err := p.Pick(snap, in)
				if err != nil {
					var nc *NoCapacity
					if !errors.As(err, &nc) || !nc.Saturated {
						t.Fatalf("pick %d: %v, want a saturated NoCapacity (429)", i, err)
					}
					refusedAt = i
					break
				}
				if d.Predicted.TTFT > 400*time.Millisecond {
					t.Fatalf("pick %d: TTFT predicted %v: the fleet must be late in TPOT alone", i, d.Predicted.TTFT)
				}
				served++
			}
			if tc.refused && (served < 3 || refusedAt < 0) {
				t.Fatalf("served %d, refused at %d: want a few served in the busy moment, then refusals", served, refusedAt)
			}
			if !tc.refused && refusedAt >= 0 {
				t.Fatalf("refused at pick %d, want every request served", refusedAt)
			}
		})
	}
}

// An engine whose whole KV cache cannot hold a request (prompt and most output) would refuse it: once the
// picker has learnt the engines' tokens, such an endpoint is no candidate for it, and a model none of whose
// endpoints can hold it has none available (its fallback for unavailability, or a 503), not a saturated one.
func TestAnEngineTooSmallForTheRequestIsNoCandidate(t *testing.T) {
	small := func(cheapBlocks, fastBlocks int) engines {
		return idleEngines(func(ep string, e *fleet.EngineMetrics) {
			e.BlockSize, e.NumBlocks = 16, fastBlocks
			if strings.HasPrefix(ep, "10.0.1.") {
				e.NumBlocks = cheapBlocks
			}
		})
	}
	snap, m := modelOf(t, mixedPolicy)
	req := request(t, strings.Repeat("word ", 2000), "q") // about 2,500 tokens at 4 characters a token
	learnt := func(p *Affinity) {
		p.Observe(Decision{EstimatedPromptTokens: 1000}, openai.Usage{PromptTokens: 1000})
	}
	for _, tc := range []struct {
		name        string
		cheap, fast int
		learn       bool
		want        string // a pool, or "none"
	}{
		{"the fast pool too small: the cheap one", 4096, 100, true, "cheap"},
		{"before the tokens are learnt, no engine is ruled out: the faster prefill", 4096, 100, false, "fast"},
		{"every engine too small: none available", 100, 100, true, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMixedPicker(small(tc.cheap, tc.fast))
			if tc.learn {
				learnt(p)
			}
			d, err := p.Pick(snap, Input{Model: m, Request: req})
			if tc.want == "none" {
				var nc *NoCapacity
				if !errors.As(err, &nc) || nc.Saturated {
					t.Fatalf("got %v, %v; want an unavailable NoCapacity", d.Endpoints, err)
				}
				return
			}
			if err != nil || d.Pool.Name != tc.want {
				t.Fatalf("got %v, %v; want pool %s", d.Pool, err, tc.want)
			}
		})
	}
}
