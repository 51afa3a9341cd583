package picker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// legsPolicy: two H200 replicas that take whole requests and both legs of a split, a 1 s TTFT target (0.8 s
// with the default margin), and every prompt of 2,000 uncached tokens or more split.
const legsPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {placement: slo}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  tiers:
    pro: {slo: {ttft: 1s, tpot: 200ms}}
  models:
  - name: m
    pools:
    - {name: fast, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}
    disaggregation: {protocol: llm-d, split: threshold, minUncachedTokens: 2000, kvBytesPerToken: 163840}
  tenants:
  - {name: pro, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// A long prompt is not prefilled where a split request's decode leg is awaited and would wait out its prefill
// past the first-token target, neither whole nor as a prefill leg. Under split: threshold a 5.6K-token prompt is
// split: decoded on the idle 10.0.0.1, prefilled on 10.0.0.2 (one prompt queued); its leg is due at 10.0.0.1 in
// about 0.31 s, its first token by 0.8 s. Under split: pays a 20K-token prompt then comes, late everywhere: about
// 1.1 s at 10.0.0.1, whose prefill from about 0.03 s to 0.88 s would hold the leg past 0.8 s, and about 1.95 s at
// 10.0.0.2, within legsTolerance. It runs whole on 10.0.0.2, though a split prefilled on 10.0.0.1 would be
// sooner; a minute later, the legs done, on the faster 10.0.0.1. Under split: threshold it would be split
// anyway, its prefill off the decoder: the decoder is placed as if no leg were awaited.
func TestLongPromptsSpareAwaitedDecodeLegs(t *testing.T) {
	threshold, pays := legsPolicy, strings.Replace(legsPolicy, "split: threshold", "split: pays", 1)
	now := time.Unix(1000, 0)
	p := newMixedPicker(engines{"10.0.0.1:1": {}, "10.0.0.2:1": {Waiting: 1}})
	p.Now = func() time.Time { return now }
	pick := func(policy, doc string) Decision {
		t.Helper()
		snap, m := modelOf(t, policy)
		pro, _ := snap.TenantForKey("sk-demo-acme")
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, doc, "?"), BodyBytes: len(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	split := pick(threshold, strings.Repeat("A document the model must read before it answers. ", 440)) // ≈ 5.6K tokens
	if split.Endpoints[0] != "10.0.0.1:1" || split.Prefill != "10.0.0.2:1" {
		t.Fatalf("the first prompt decoded on %s, prefilled on %q; the test wants 10.0.0.1 and 10.0.0.2", split.Endpoints[0], split.Prefill)
	}
	long := func(n int) string { // ≈ 20K tokens, each a document of its own
		return strings.Repeat(fmt.Sprintf("Document %d, longer, about something else entirely. ", n), 1600)
	}
	if d := pick(pays, long(1)); d.Endpoints[0] != "10.0.0.2:1" || d.Prefill != "" || d.Predicted.legsLate != 0 {
		t.Errorf("with the split's leg awaited at 10.0.0.1: the long prompt went to %s, prefilled on %q (legs made late %d)",
			d.Endpoints[0], d.Prefill, d.Predicted.legsLate)
	}
	if d := pick(threshold, long(2)); d.Endpoints[0] != "10.0.0.1:1" || d.Prefill != "10.0.0.2:1" {
		t.Errorf("split anyway: decoded on %s, prefilled on %q; want the faster decoder 10.0.0.1", d.Endpoints[0], d.Prefill)
	}
	p.Prefilled(split)
	now = now.Add(time.Minute) // the long prompts' own legs, and their prefills, long done
	if d := pick(pays, long(3)); d.Endpoints[0] != "10.0.0.1:1" || d.Prefill != "" {
		t.Errorf("with no leg awaited: the long prompt went to %s, prefilled on %q; want the faster 10.0.0.1 whole", d.Endpoints[0], d.Prefill)
	}
}

// legsLate counts a leg only when it would arrive after the prompt, in time without it and late with it,
// wherever in the ring of recent sends its booking is; the splits' bookings in the prefill ahead are not
// prefilled there.
func TestLegsLate(t *testing.T) {
	now := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return now.Add(d) }
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	cases := []struct {
		name            string
		legAt, legBy    time.Duration
		prefilled       bool
		decodeLeg, ttft time.Duration // the prompt's prediction there: 24,000 tokens at 24,000 a second
		booked          float64       // the leg's own booking, in the prefill ahead
		before, after   int           // sends before the booking, and after it
		want            int32
	}{
		{name: "the leg arrives during the prefill, which ends past its target", legAt: ms(300), legBy: ms(800), ttft: ms(1000), want: 1},
		{name: "the leg arrives after the prompt, before its prefill starts", legAt: ms(300), legBy: ms(800), decodeLeg: ms(400), ttft: ms(1400), want: 1},
		{name: "the leg arrived before the prompt", legAt: -ms(100), legBy: ms(800), ttft: ms(1000)},
		{name: "the prefill ends before the leg's target", legAt: ms(300), legBy: ms(1200), ttft: ms(1000)},
		{name: "the leg's first token is out", legAt: ms(300), legBy: ms(800), ttft: ms(1000), prefilled: true},
		{name: "the leg would be late anyway", legAt: ms(900), legBy: ms(800), ttft: ms(1000)},
		// The booking's 9,600 tokens are 0.4 s of the 0.5 s ahead: the prompt's prefill runs from 0.1 s to 1.1 s,
		// within a target at 1.2 s; counted as the engine's, it would end at 1.5 s.
		{name: "the booking ahead is not prefilled there", legAt: ms(300), legBy: ms(1200), decodeLeg: ms(500), ttft: ms(1500), booked: 9600},
		{name: "the booking ahead, a target the prefill passes", legAt: ms(300), legBy: ms(1050), decodeLeg: ms(500), ttft: ms(1500), booked: 9600, want: 1},
		{name: "the booking further in the ring", legAt: ms(300), legBy: ms(800), ttft: ms(1000), before: 5, after: 3, want: 1},
		{name: "the booking's place taken by newer sends", legAt: ms(300), legBy: ms(800), ttft: ms(1000), before: 5, after: recentSends},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &endpointModel{}
			send := func(i int) { m.remember(sentPrompt{at: now.Add(-time.Duration(i+1) * time.Millisecond), uncached: 1}) }
			for i := range tc.before {
				send(i)
			}
			m.remember(sentPrompt{at: now, firstBy: at(time.Second), uncached: max(tc.booked, 1)})
			pd := Prediction{sentAt: now, uncached: max(tc.booked, 1)}
			(&predictor{eps: map[string]*endpointModel{"x": m}}).prefilledRemotely("x", pd, at(tc.legAt), at(tc.legBy))
			for i := range tc.after {
				send(tc.before + i)
			}
			if tc.prefilled {
				m.forgetSend(pd)
			}
			prompt := Prediction{TTFT: tc.ttft, decodeLeg: tc.decodeLeg, uncached: 24000}
			if got := m.legsLate(&prompt, 24000, now); got != tc.want {
				t.Errorf("legsLate %d, want %d", got, tc.want)
			}
		})
	}
}

// SLO placement keeps a request off an endpoint where it would make an awaited leg late: among those meeting
// the targets while another meets them without (spareLegs); among the late ones, for one at most legsTolerance
// slower at the tail of its spread, or within lateTolerance of a fastest that makes none late (spareLegsLate).
func TestSLOPlacementSparesLegs(t *testing.T) {
	cand := func(ep string, meets, harms bool, ttft time.Duration) scored {
		return scored{endpoint: ep, meets: meets, harmsLegs: harms, pred: Prediction{set: true, TTFT: ttft}}
	}
	good := []scored{cand("a", true, true, time.Second), cand("b", true, false, 2*time.Second)}
	if n := spareLegs(good, 2); n != 1 || good[0].meets || !good[1].meets {
		t.Errorf("spareLegs: %d meet (a %v, b %v), want b alone", n, good[0].meets, good[1].meets)
	}
	allHarm := []scored{cand("a", true, true, time.Second), cand("b", true, true, 2*time.Second)}
	if n := spareLegs(allHarm, 2); n != 2 || !allHarm[0].meets || !allHarm[1].meets {
		t.Errorf("spareLegs with every meeting candidate harming: %d meet, want both as judged", n)
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name string
		late []scored
		want string
	}{
		{"a sparing one within twice the fastest", []scored{cand("fast", false, true, ms(1000)), cand("harms too", false, true, ms(1200)),
			cand("slow", false, false, ms(1900))}, "slow,fast,harms too"},
		{"past it", []scored{cand("fast", false, true, ms(1000)), cand("harms too", false, true, ms(1200)),
			cand("slow", false, false, ms(2100))}, "fast,harms too,slow"},
		{"a fastest that spares them, one that does not within 25 %", []scored{cand("a", false, false, ms(1000)), cand("b", false, true, ms(1100)),
			cand("c", false, false, ms(1200)), cand("d", false, false, ms(1300))}, "a,c,b,d"},
	} {
		spareLegsLate(tc.late)
		var got []string
		for _, c := range tc.late {
			got = append(got, c.endpoint)
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, got, tc.want)
		}
	}
}

// What a request's prefill would do to the legs awaited at a candidate counts in its placement only where it
// would prefill there: not on a decode pool's replica, nor when split: threshold splits it anyway.
func TestPrefillsHere(t *testing.T) {
	decode, both := &policies.Pool{Role: policies.RoleDecode}, &policies.Pool{}
	pays := &policies.Disaggregation{Split: policies.SplitWhenItPays, MinUncachedTokens: 2000}
	threshold := &policies.Disaggregation{Split: policies.SplitPastThreshold, MinUncachedTokens: 2000}
	cases := []struct {
		name     string
		pool     *policies.Pool
		dg       *policies.Disaggregation
		uncached float64
		scale    float64 // estimated ÷ engine tokens
		want     bool
	}{
		{"a pool that does both, split when it pays", both, pays, 20000, 1, true},
		{"a decode pool's replica", decode, pays, 20000, 1, false},
		{"split: threshold, past the floor", both, threshold, 20000, 1, false},
		{"split: threshold, below the floor", both, threshold, 1000, 1, true},
		{"split: threshold, past the floor in engine tokens, not as estimated", both, threshold, 2500, 0.5, true},
		{"no disaggregation", both, nil, 20000, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &decision{in: Input{Model: &policies.Model{Disaggregation: tc.dg}}, prompt: prompt{scale: tc.scale}}
			if got := d.prefillsHere(&scored{pool: tc.pool, pred: Prediction{uncached: tc.uncached}}); got != tc.want {
				t.Errorf("prefillsHere %v, want %v", got, tc.want)
			}
		})
	}
}

// The prefill leg of a split counts the legs awaited at each would-be prefiller as they are, whatever the
// placement of decoders made of them: of two prefillers the sooner, which a leg awaits, is passed over.
func TestPrefillerSparesAwaitedLegs(t *testing.T) {
	snap, m := modelOf(t, strings.Replace(disaggPolicy, "role: prefill, endpoints:", "role: both, endpoints:", 1))
	p := newMixedPicker(idleEngines(nil))
	d := &decision{p: p, snap: snap, in: Input{Model: m}, slo: true, prompt: prompt{hashes: []uint64{42}}, routing: policies.Routing{MaxWaiting: 8},
		predicted: []scored{
			{endpoint: "10.0.0.1:1", pred: Prediction{set: true, TTFT: 300 * time.Millisecond, legsLate: 1}},
			{endpoint: "10.0.0.2:1", pred: Prediction{set: true, TTFT: 500 * time.Millisecond}},
		}}
	if ep, _ := d.prefiller(policies.RoleBoth, "10.0.1.1:1", ""); ep != "10.0.0.2:1" {
		t.Errorf("prefiller %s, want 10.0.0.2, which no leg awaits", ep)
	}
}
