package picker

import (
	"math"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// Other gateway replicas' prefill at an endpoint shows in its engine's token counters, not in this gateway's
// sends: the prompt tokens the engine computed between its readings, less this gateway's own prefilled in
// between, join the prefill share TPOT is predicted on.
func TestTPOTPredictionCountsOtherReplicasPrefill(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	const ep = "10.0.0.1:1" // an H200: 24,000 tokens a second
	t0 := time.Unix(1000, 0)
	counted := func(at time.Time, prompt, cached float64) fleet.EngineMetrics {
		return fleet.EngineMetrics{At: at, PromptTokens: prompt, CachedPromptTokens: cached}
	}
	for _, tc := range []struct {
		name          string
		first, second fleet.EngineMetrics // the endpoint's readings
		own           float64             // this gateway's tokens sent there between the readings
		inPrefill     bool                // and their first tokens not yet out
		remote        bool                // or split requests' bookings there, prefilled elsewhere
		early         bool                // or sent before the first reading, first tokens out between the two
		now           time.Time           // of the second decision
		want          float64             // its predicted TPOT ÷ an idle endpoint's
	}{
		// 120,000 tokens computed in 10 s: half of the next 10 s prefilling, a token every two decode steps.
		{"others' prefill", counted(t0, 500000, 100000), counted(t0.Add(10*time.Second), 700000, 180000), 0,
			false, false, false, t0.Add(10 * time.Second), 2},
		{"this gateway's own, counted once", counted(t0, 500000, 100000), counted(t0.Add(10*time.Second), 700000, 180000),
			120000, false, false, false, t0.Add(10 * time.Second), 2},
		// The engine counted them as it admitted them: they are not another replica's.
		{"this gateway's own, still in prefill", counted(t0, 500000, 100000), counted(t0.Add(10*time.Second), 700000, 180000),
			120000, true, false, false, t0.Add(10 * time.Second), 2},
		{"no counters", counted(t0, 0, 0), counted(t0.Add(10*time.Second), 0, 0), 0, false, false, false, t0.Add(10 * time.Second), 1},
		// Bookings of split requests: the engine pulled their KV cache (cache hits); what it computed is others'.
		{"split requests' bookings are not this gateway's prefill", counted(t0, 500000, 100000),
			counted(t0.Add(10*time.Second), 700000, 180000), 120000, false, true, false, t0.Add(10 * time.Second), 2},
		// An engine that counts a prompt at its first token: this gateway's own, sent before the first reading.
		// They left the share's window; the engine's count is theirs, not another replica's.
		{"this gateway's own, sent before the first reading", counted(t0, 500000, 100000),
			counted(t0.Add(10*time.Second), 700000, 180000), 120000, false, false, true, t0.Add(10 * time.Second), 1},
		{"counters gone back: an engine restarted", counted(t0, 500000, 100000), counted(t0.Add(10*time.Second), 120000, 10000),
			0, false, false, false, t0.Add(10 * time.Second), 1},
		{"readings less than a second apart", counted(t0, 500000, 100000), counted(t0.Add(500*time.Millisecond), 512000, 100000),
			0, false, false, false, t0.Add(500 * time.Millisecond), 1},
		{"the newest reading older than the window", counted(t0, 500000, 100000), counted(t0.Add(10*time.Second), 700000, 180000),
			0, false, false, false, t0.Add(21 * time.Second), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := idleEngines(nil)
			p := newMixedPicker(eng)
			now := t0
			p.Now = func() time.Time { return now }
			in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
			tpot := func() time.Duration { return scoreAt(t, p, snap, in, ep).TPOT }
			idle := tpot()
			// This gateway's own sends, 30,000 tokens each.
			var sends []Prediction
			for i := range int(tc.own / 30000) {
				at := t0.Add(time.Duration(i+1) * time.Second)
				if tc.early {
					at = t0.Add(-time.Duration(i+1) * time.Second)
				}
				sends = append(sends, Prediction{set: true, sentAt: at, uncached: 30000, TTFT: time.Minute})
			}
			send := func() {
				for _, pd := range sends {
					p.pred.sent(ep, pd, m.Name, false, false)
					if tc.remote {
						p.pred.prefilledRemotely(ep, pd, time.Time{}, time.Time{})
					}
				}
			}
			if tc.early {
				send()
			}
			eng[ep] = tc.first
			if got := tpot(); got != idle && !tc.early {
				t.Fatalf("one reading moved TPOT from %v to %v", idle, got)
			}
			if !tc.early {
				send()
			}
			for _, pd := range sends {
				if !tc.inPrefill && !tc.remote {
					p.pred.prefilled(ep, pd)
				}
			}
			eng[ep], now = tc.second, tc.now
			if got, want := tpot(), time.Duration(tc.want*float64(idle)); math.Abs(float64(got-want)) > float64(time.Millisecond) {
				t.Errorf("predicted TPOT %v, want %v (%g × idle %v)", got, want, tc.want, idle)
			}
		})
	}
}

// The others' prefill is reckoned over the prefill window however often the engine is read: a scrape every 100 ms
// keeps sixteen readings spanning it, not the last 1.5 s, over which one long prompt reads as a rate six times
// its share of the window.
func TestOthersRateSpansTheWindowAtAnyScrapeInterval(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, every := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, time.Second, 2 * time.Second} {
		var e engineCounts
		prompt := 1e6
		var at time.Time
		for i := 0; at.Sub(t0) < 30*time.Second; i++ {
			at = t0.Add(time.Duration(i) * every)
			if at.Sub(t0) == 30*time.Second {
				prompt += 14000 // one long prompt, in the last reading
			}
			e.note(&scored{readAt: at, prompt: prompt, cached: 1, counted: true})
		}
		// 14,000 tokens over the window: the oldest reading kept within it is 9.33-10 s back (engineSpacing).
		if got := e.othersRate(at); got < 1400 || got > 14000/(prefillWindow-max(every, engineSpacing)).Seconds() {
			t.Errorf("reading every %v: others' rate %.0f tokens/s, want 14,000 over 8-10 s", every, got)
		}
	}
}
