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
// sooner; once the leg's first token is out, on the faster 10.0.0.1. Under split: threshold it would be split
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
	if d := pick(pays, long(3)); d.Endpoints[0] != "10.0.0.1:1" || d.Prefill != "" {
		t.Errorf("with the split's first token out: the long prompt went to %s, prefilled on %q; want the faster 10.0.0.1 whole", d.Endpoints[0], d.Prefill)
	}
}

// legsLate counts a leg only when it would arrive while the prompt prefills, in time without it and late with
// it; the splits' bookings in the prefill ahead are not prefilled there.
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
		want            int32
	}{
		{name: "the leg arrives during the prefill, which ends past its target", legAt: ms(300), legBy: ms(800), ttft: ms(1000), want: 1},
		{name: "the leg arrives before the prefill starts", legAt: ms(300), legBy: ms(800), decodeLeg: ms(400), ttft: ms(1400)},
		{name: "the prefill ends before the leg's target", legAt: ms(300), legBy: ms(1200), ttft: ms(1000)},
		{name: "the leg's first token is out", legAt: ms(300), legBy: ms(800), ttft: ms(1000), prefilled: true},
		{name: "the leg would be late anyway", legAt: ms(900), legBy: ms(800), ttft: ms(1000)},
		// The booking's 4,800 tokens are 0.2 s of the 0.4 s ahead: the prompt starts at 0.2 s, before the leg.
		{name: "the booking ahead is not prefilled there", legAt: ms(300), legBy: ms(800), decodeLeg: ms(400), ttft: ms(1400), booked: 4800, want: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &endpointModel{}
			m.remember(sentPrompt{at: now, firstBy: at(time.Second), uncached: max(tc.booked, 1)})
			pd := Prediction{sentAt: now, uncached: max(tc.booked, 1)}
			(&predictor{eps: map[string]*endpointModel{"x": m}}).prefilledRemotely("x", pd, at(tc.legAt), at(tc.legBy))
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
// slower at the tail of its spread (spareLegsLate).
func TestSLOPlacementSparesLegs(t *testing.T) {
	cand := func(ep string, meets bool, legs int32, ttft time.Duration) scored {
		return scored{endpoint: ep, meets: meets, pred: Prediction{set: true, TTFT: ttft, legsLate: legs}}
	}
	good := []scored{cand("a", true, 1, time.Second), cand("b", true, 0, 2*time.Second)}
	if n := spareLegs(good, 2); n != 1 || good[0].meets || !good[1].meets {
		t.Errorf("spareLegs: %d meet (a %v, b %v), want b alone", n, good[0].meets, good[1].meets)
	}
	allHarm := []scored{cand("a", true, 1, time.Second), cand("b", true, 2, 2*time.Second)}
	if n := spareLegs(allHarm, 2); n != 2 || !allHarm[0].meets || !allHarm[1].meets {
		t.Errorf("spareLegs with every meeting candidate harming: %d meet, want both as judged", n)
	}
	for _, tc := range []struct {
		name  string
		slow  time.Duration
		first string
	}{{"within twice the fastest", 1900 * time.Millisecond, "slow"}, {"past it", 2100 * time.Millisecond, "fast"}} {
		late := []scored{cand("fast", false, 1, time.Second), cand("harms too", false, 1, 1200*time.Millisecond), cand("slow", false, 0, tc.slow)}
		spareLegsLate(late)
		if late[0].endpoint != tc.first {
			t.Errorf("%s: %s first, want %s", tc.name, late[0].endpoint, tc.first)
		}
	}
}

// What a request's prefill would do to the legs awaited at a candidate counts only where it would prefill there:
// not on a decode pool's replica, nor when split: threshold splits it anyway.
func TestPrefillsElsewhere(t *testing.T) {
	decode, both := &policies.Pool{Role: policies.RoleDecode}, &policies.Pool{}
	pays := &policies.Disaggregation{Split: policies.SplitWhenItPays, MinUncachedTokens: 2000}
	threshold := &policies.Disaggregation{Split: policies.SplitPastThreshold, MinUncachedTokens: 2000}
	cases := []struct {
		name     string
		pool     *policies.Pool
		dg       *policies.Disaggregation
		uncached float64
		want     int32
	}{
		{"a pool that does both, split when it pays", both, pays, 20000, 1},
		{"a decode pool's replica", decode, pays, 20000, 0},
		{"split: threshold, past the floor", both, threshold, 20000, 0},
		{"split: threshold, below the floor", both, threshold, 1000, 1},
		{"no disaggregation", both, nil, 20000, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := &decision{in: Input{Model: &policies.Model{Disaggregation: tc.dg}}}
			c := scored{pool: tc.pool, pred: Prediction{legsLate: 1, uncached: tc.uncached}}
			if d.prefillsElsewhere(&c); c.pred.legsLate != tc.want {
				t.Errorf("legsLate %d, want %d", c.pred.legsLate, tc.want)
			}
		})
	}
}
