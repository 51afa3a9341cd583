package picker

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// recordPlacements keeps what a picker publishes.
type recordPlacements struct{ sent []Placement }

func (r *recordPlacements) Publish(pl Placement) { r.sent = append(r.sent, pl) }

// prefills are the long prompts among the placements published.
func (r *recordPlacements) prefills() []Placement {
	var out []Placement
	for _, pl := range r.sent {
		if pl.Prefill > 0 {
			out = append(out, pl)
		}
	}
	return out
}

// A replica under SLO placement publishes the long prompts it sends — a whole request's at its endpoint, a split's
// prefill leg at its prefiller and its booking at its decoder — with their uncached tokens and when their first
// token is due; short ones, and decisions without predictions, publish nothing of the kind.
func TestLongPromptsSentArePublished(t *testing.T) {
	long := strings.Repeat("A long document the model must read before it answers. ", 800) // ≈ 11K tokens
	for _, tc := range []struct {
		name, policy, system string
		want                 int // long prompts published
		split                bool
	}{
		{"a long prompt, whole", sloPolicy(policies.PlacementSLO, policies.WhenSaturated), long, 1, false},
		{"a short prompt", sloPolicy(policies.PlacementSLO, policies.WhenSaturated), "sys", 0, false},
		{"a long prompt without SLO placement", mixedPolicy, long, 0, false},
		{"a long prompt, split", sloDisaggPolicy, long, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, m := modelOf(t, tc.policy)
			pro, _ := snap.TenantForKey("sk-demo-acme")
			p, rec := newMixedPicker(idleEngines(nil)), &recordPlacements{}
			p.Placements = rec
			d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, tc.system, "?"), BodyBytes: len(tc.system)}})
			if err != nil {
				t.Fatal(err)
			}
			got := rec.prefills()
			if len(got) != tc.want {
				t.Fatalf("published %d long prompts (%+v), want %d", len(got), got, tc.want)
			}
			if tc.want == 0 {
				return
			}
			if (d.Prefill != "") != tc.split {
				t.Fatalf("split to %q, want split %v", d.Prefill, tc.split)
			}
			type leg struct {
				ep     string
				pd     Prediction
				booked bool
			}
			want := []leg{{d.Endpoints[0], d.Predicted, false}}
			if tc.split {
				want = []leg{{d.Prefill, d.prefillPred, false}, {d.Endpoints[0], d.Predicted, true}}
			}
			for i, w := range want {
				pl := got[i]
				if pl.Endpoint != w.ep || float64(pl.Prefill) != math.Floor(w.pd.uncached) || pl.Due != w.pd.TTFT+w.pd.tail ||
					pl.Due <= 0 || pl.Booked != w.booked || pl.ID == 0 {
					t.Errorf("published %+v, want %s, %.0f tokens, due %v, booked %v, an id", pl, w.ep, w.pd.uncached, w.pd.TTFT+w.pd.tail, w.booked)
				}
			}
			if tc.split && got[0].ID == got[1].ID {
				t.Error("both ends of a split published under one id")
			}
			// The first token reports each done, by its id, where it was sent; the settlement that reports it
			// again does not.
			p.Prefilled(d)
			p.Prefilled(d)
			var done []Placement
			for _, pl := range rec.sent {
				if pl.Done {
					done = append(done, pl)
				}
			}
			if len(done) != len(got) {
				t.Fatalf("%d long prompts reported done (%+v), want %d", len(done), done, len(got))
			}
			for _, sent := range got {
				if !slices.ContainsFunc(done, func(pl Placement) bool { return pl.ID == sent.ID && pl.Endpoint == sent.Endpoint }) {
					t.Errorf("%+v not reported done (done: %+v)", sent, done)
				}
			}
		})
	}
}

// Another replica's long prompt counts at the endpoint, from when it is heard of: in the prefill ahead until its
// first token is due, and in the prefill share (TPOT) over the window; the engine's counters then take it off the
// others' part, as they take this replica's own, so it is not counted twice.
func TestOtherReplicasLongPromptsCount(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	const ep = "10.0.0.1:1" // an H200: 24,000 tokens a second
	t0 := time.Unix(1000, 0)
	eng := idleEngines(nil)
	p := newMixedPicker(eng)
	p.PolicyChanged(snap)
	now := t0
	p.Now = func() time.Time { return now }
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
	predicted := func() (ttft, tpot time.Duration) {
		t.Helper()
		s := scoreAt(t, p, snap, in, ep)
		return s.TTFT, s.TPOT
	}
	eng[ep] = fleet.EngineMetrics{At: t0, PromptTokens: 500000, CachedPromptTokens: 100000}
	idleTTFT, idleTPOT := predicted()
	if p.Learn(Placement{Endpoint: "10.9.9.9:1", Prefill: 48000, Due: 3 * time.Second, ID: 1}) {
		t.Error("learnt a prompt sent to an endpoint the policy does not list")
	}
	if p.Learn(Placement{Endpoint: ep, Prefill: 48000, Due: -time.Second, ID: 2}) {
		t.Error("learnt a prompt due before it was sent")
	}
	// 48,000 tokens: 2 s of prefill ahead, and 0.2 of the next 10 s.
	if !p.Learn(Placement{Endpoint: ep, Prefill: 48000, Due: 3 * time.Second, ID: 3}) {
		t.Fatal("did not learn another replica's long prompt")
	}
	p.Learn(Placement{Endpoint: ep, Prefill: 48000, Due: 3 * time.Second, ID: 3}) // a replay: dropped
	fresh := newMixedPicker(eng)
	fresh.PolicyChanged(snap)
	if fresh.Learn(Placement{Endpoint: ep, Prefill: 48000, Due: 3 * time.Second, ID: 4}) {
		t.Error("learnt a prompt sent to an endpoint this replica has not predicted for")
	}
	near := func(got, want time.Duration, what string) {
		t.Helper()
		if math.Abs(float64(got-want)) > float64(want)/50 {
			t.Errorf("%s: predicted %v, want %v", what, got, want)
		}
	}
	ttft, tpot := predicted()
	near(ttft-idleTTFT, 2*time.Second, "TTFT behind another replica's prompt, less idle")
	near(tpot, time.Duration(float64(idleTPOT)/0.8), "TPOT while it prefills")
	// Another, reported done: it leaves the prefill ahead at once, and stays in the share.
	p.Learn(Placement{Endpoint: ep, Prefill: 24000, Due: 3 * time.Second, ID: 5})
	if ttft, _ = predicted(); ttft-idleTTFT < 2900*time.Millisecond {
		t.Errorf("behind two long prompts, TTFT %v over idle, want 3 s", ttft-idleTTFT)
	}
	if !p.Learn(Placement{Endpoint: ep, ID: 5, Done: true}) {
		t.Error("a long prompt done at an endpoint it predicts for was not learnt")
	}
	ttft, tpot = predicted()
	near(ttft-idleTTFT, 2*time.Second, "TTFT once the second is done")
	near(tpot, time.Duration(float64(idleTPOT)/0.7), "TPOT while both count in the share")
	// The first one's first token is due: it leaves the prefill ahead; the engine counted both, and the
	// counters do not count them again.
	now = t0.Add(4 * time.Second)
	eng[ep] = fleet.EngineMetrics{At: now, PromptTokens: 572000, CachedPromptTokens: 100000}
	ttft, tpot = predicted()
	near(ttft, idleTTFT, "TTFT once it is due")
	near(tpot, time.Duration(float64(idleTPOT)/0.7), "TPOT with the engine's counters too")
	// Once it was due at a reading it is off the counters' books: what the engine computes later is the others'
	// again (24,000 tokens in 2 s: half of its time).
	now = t0.Add(16 * time.Second)
	eng[ep] = fleet.EngineMetrics{At: now, PromptTokens: 572000, CachedPromptTokens: 100000}
	predicted()
	now = t0.Add(18 * time.Second)
	eng[ep] = fleet.EngineMetrics{At: now, PromptTokens: 596000, CachedPromptTokens: 100000}
	_, tpot = predicted()
	near(tpot, 2*idleTPOT, "TPOT with others' unpublished prompts after it")
}

// A split's booking at a decoder, published, counts in its prefill ahead only: the prefill runs elsewhere.
func TestOtherReplicasBookingsCountAhead(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	const ep = "10.0.0.1:1"
	p := newMixedPicker(idleEngines(nil))
	in := Input{Tenant: proTenant(snap), Model: m, Request: request(t, "sys", "q")}
	score := func() Score { t.Helper(); return scoreAt(t, p, snap, in, ep) }
	idle := score()
	p.Learn(Placement{Endpoint: ep, Prefill: 48000, Due: 3 * time.Second, ID: 1, Booked: true})
	got := score()
	if got.TTFT-idle.TTFT < 1900*time.Millisecond || got.TPOT != idle.TPOT {
		t.Errorf("behind a booking of 48,000 tokens: TTFT %v → %v (want 2 s more), TPOT %v → %v (want the same)",
			idle.TTFT, got.TTFT, idle.TPOT, got.TPOT)
	}
	if known := p.pred.eps[ep].engine.knownSent; known != 0 {
		t.Errorf("a booking counts %.0f tokens among those the engine prefills", known)
	}
}

// The others' ring holds recentSends prompts per endpoint; one it drops before it was due is counted among the
// known ones prefilled then (its prefill long done, or never begun), once.
func TestOtherReplicasPromptsLeaveTheRing(t *testing.T) {
	var p predictor
	m := p.model("e", 0, 0, 0)
	now := time.Unix(1000, 0)
	for i := range recentSends + 1 {
		p.learnPrefill("e", uint64(i+1), 1000, time.Hour, false, now)
	}
	if m.engine.knownSent != float64(recentSends+1)*1000 || m.engine.knownPrefilled != 1000 {
		t.Errorf("known sent %.0f, prefilled %.0f; want %d and 1000", m.engine.knownSent, m.engine.knownPrefilled, (recentSends+1)*1000)
	}
	m.settleOthers(now.Add(2 * time.Hour))
	m.settleOthers(now.Add(3 * time.Hour))
	if m.engine.knownPrefilled != m.engine.knownSent {
		t.Errorf("once all were due: known prefilled %.0f of %.0f sent", m.engine.knownPrefilled, m.engine.knownSent)
	}
}

// scoreAt picks for in and returns the decision's score of ep (the policy sets debugScores).
func scoreAt(t *testing.T, p *Affinity, snap *policies.Snapshot, in Input, ep string) Score {
	t.Helper()
	d, err := p.Pick(snap, in)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Scores {
		if s.Endpoint == ep {
			return s
		}
	}
	t.Fatalf("no score for %s: %v", ep, d.Scores)
	return Score{}
}
