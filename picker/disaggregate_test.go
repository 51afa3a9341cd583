package picker

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// disaggPolicy is mixedPolicy with its H200 pool prefilling only, three of its replicas, and the L40S pool decoding.
var disaggPolicy = strings.Replace(strings.Replace(strings.Replace(mixedPolicy,
	`    - {name: cheap, hardwareClass: l40s, engine: vllm, endpoints:`, `    - {name: cheap, hardwareClass: l40s, engine: vllm, role: decode, endpoints:`, 1),
	`    - {name: fast, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}`,
	`    - {name: fast, hardwareClass: h200, engine: vllm, role: prefill, endpoints: ["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]}`, 1),
	"    fallbacks:", "    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840, minUncachedTokens: 2000}\n    fallbacks:", 1)

// A request whose uncached prompt reaches minUncachedTokens is split: decoded on the L40S pool, prefilled on an
// H200 replica, the same one for the same prefix; a short one runs whole; with no prefiller that can take it
// (stale metrics, a full queue) the long one runs whole too.
func TestLongUncachedPromptsAreSplit(t *testing.T) {
	snap, m := modelOf(t, disaggPolicy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	long := strings.Repeat("A long document the model must read before it answers. ", 400) // ≈ 5.6K tokens
	eng := idleEngines(nil)
	eng["10.0.0.3:1"] = fleet.EngineMetrics{}
	pick := func(p *Affinity, system, user string) Decision {
		t.Helper()
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, system, user), BodyBytes: len(system)}})
		if err != nil {
			t.Fatal(err)
		}
		if d.Pool.Name != "cheap" {
			t.Fatalf("decoded on %s", d.Pool.Name)
		}
		return d
	}
	p := newMixedPicker(eng)
	first := pick(p, long, "first question")
	if !strings.HasPrefix(first.Prefill, "10.0.0.") {
		t.Fatalf("a %d-token uncached prompt was not split: prefill %q", first.EstimatedPromptTokens, first.Prefill)
	}
	for _, q := range []string{"second question", "third"} {
		if d := pick(newMixedPicker(eng), long, q); d.Prefill != first.Prefill {
			t.Errorf("the same prefix went to prefiller %s, then %s", first.Prefill, d.Prefill)
		}
	}
	spread := map[string]bool{}
	for i := range 12 {
		spread[pick(newMixedPicker(eng), strings.Repeat(string(rune('a'+i))+" other document. ", 2000), "?").Prefill] = true
	}
	if len(spread) < 2 {
		t.Errorf("twelve prefixes all went to %v", spread)
	}
	if d := pick(newMixedPicker(eng), "hi", "short"); d.Prefill != "" {
		t.Errorf("a short prompt was split, to %s", d.Prefill)
	}
	busy := idleEngines(func(ep string, m *fleet.EngineMetrics) {
		if strings.HasPrefix(ep, "10.0.0.") {
			m.Waiting = 1000
		}
	})
	if d := pick(newMixedPicker(busy), long, "while the prefillers are full"); d.Prefill != "" {
		t.Errorf("split onto a full prefiller %s", d.Prefill)
	}
}

// A prefiller a split request failed on rests: no split names it until the rest is over; with every prefiller
// resting, requests run whole.
func TestAFailedPrefillerRests(t *testing.T) {
	snap, m := modelOf(t, disaggPolicy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	now := time.Unix(1000, 0)
	p := newMixedPicker(idleEngines(nil)) // 10.0.0.3 reports nothing: two prefillers can take legs
	p.Now = func() time.Time { return now }
	n := 0
	pick := func() Decision {
		t.Helper()
		n++ // a new document each time: no decoder holds it
		doc := strings.Repeat(fmt.Sprintf("Document %d, which the model must read. ", n), 500)
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, doc, "?"), BodyBytes: len(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	p.PrefillFailed("10.0.0.1:1")
	for range 10 {
		if pf := pick().Prefill; pf != "10.0.0.2:1" {
			t.Fatalf("with 10.0.0.1 resting a split went to %q", pf)
		}
	}
	p.PrefillFailed("10.0.0.2:1")
	if d := pick(); d.Prefill != "" || d.Pool.Name != "cheap" {
		t.Fatalf("with every prefiller resting the request was split to %q", d.Prefill)
	}
	now = now.Add(prefillCooldown + time.Second)
	seen := map[string]bool{}
	for range 10 {
		seen[pick().Prefill] = true
	}
	if !seen["10.0.0.1:1"] || !seen["10.0.0.2:1"] {
		t.Errorf("after the rest the splits went to %v, want both prefillers again", seen)
	}
}

// A split request's first alternative is its decode replica's engine past the sidecar, when the pool names
// engines: Envoy's first retry after a failed prefill leg goes there. A whole request's list is unchanged.
func TestSplitRequestsRetryOnTheDecoderEngine(t *testing.T) {
	withEngines := strings.Replace(disaggPolicy, `role: decode, endpoints: ["10.0.1.1:1", "10.0.1.2:1"]`,
		`role: decode, endpoints: ["10.0.1.1:1", "10.0.1.2:1"], engineEndpoints: ["10.0.1.1:2", "10.0.1.2:2"]`, 1)
	if withEngines == disaggPolicy {
		t.Fatal("disaggPolicy changed shape: its decode pool's endpoints are not where this test looks")
	}
	snap, m := modelOf(t, withEngines)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	pick := func(system string) Decision {
		t.Helper()
		d, err := newMixedPicker(idleEngines(nil)).Pick(snap, Input{Tenant: pro, Model: m,
			Request: &openai.Request{Prompt: chatPrompt(t, system, "?"), BodyBytes: len(system)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := pick(strings.Repeat("A long document the model must read before it answers. ", 400))
	engine := strings.TrimSuffix(d.Endpoints[0], ":1") + ":2"
	if d.Prefill == "" || len(d.Endpoints) < 2 || d.Endpoints[1] != engine {
		t.Fatalf("split onto %q, endpoints %v: want the decoder's engine %s second", d.Prefill, d.Endpoints, engine)
	}
	if d := pick("hi"); d.Prefill != "" || slices.ContainsFunc(d.Endpoints, func(ep string) bool { return strings.HasSuffix(ep, ":2") }) {
		t.Fatalf("a whole request: prefill %q, endpoints %v", d.Prefill, d.Endpoints)
	}
}

// oneClassPolicy disaggregates a model on one H200 pool that does both, with a tight TPOT target.
const oneClassPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  tiers:
    pro: {slo: {ttft: 5s, tpot: 22ms}}
  models:
  - name: m
    pools:
    - {name: a, hardwareClass: h200, engine: vllm, maxConcurrency: 64, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}
  tenants:
  - {name: pro, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// A request is split only when splitting pays: not onto a prefiller of the decoder's own class while the
// decoder is idle (the transfer only adds to its TTFT), but when the decoder runs a batch whose decodes the
// prefill would stall past their TPOT target (16K tokens at 24K a second: 0.69 s, against what 22 ms leaves beyond a
// near-full batch's 20 ms step over 256 tokens: 0.44 s).
func TestSplitOnlyWhenItPays(t *testing.T) {
	snap, m := modelOf(t, oneClassPolicy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	doc := strings.Repeat("A long contract the model must read before it answers. ", 1200) // ≈ 16K tokens
	pick := func(running float64) Decision {
		t.Helper()
		eng := engines{}
		for _, ep := range []string{"10.0.0.1:1", "10.0.0.2:1"} {
			eng[ep] = fleet.EngineMetrics{Running: running}
		}
		p := newMixedPicker(eng)
		p.Hasher.MaxBlocks = 1 << 14
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, doc, "?"), BodyBytes: len(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := pick(0); d.Prefill != "" {
		t.Errorf("idle decoder of the prefiller's class: split to %s (%d tokens estimated)", d.Prefill, d.EstimatedPromptTokens)
	}
	if d := pick(60); d.Prefill == "" || d.Prefill == d.Endpoints[0] {
		t.Errorf("a decoder running 60 of 64: prefill %q, decoder %s (%d tokens estimated)", d.Prefill, d.Endpoints[0], d.EstimatedPromptTokens)
	}
	// The threshold alone decides with split: threshold.
	snap, m = modelOf(t, strings.Replace(oneClassPolicy, "{protocol: llm-d,", "{protocol: llm-d, split: threshold,", 1))
	if d := pick(0); d.Prefill == "" || d.Prefill == d.Endpoints[0] {
		t.Errorf("split: threshold, an idle decoder: prefill %q, decoder %s", d.Prefill, d.Endpoints[0])
	}
}

// twoPricePolicy decodes on H200s and prefills on a class half as fast at under a third of the price.
const twoPricePolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {placement: slo}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    slowfill: {costPerHour: 1, prefillTokensPerSecond: 12000, decodeTokensPerSecond: 1000}
  tiers:
    pro: {slo: {ttft: TARGET, tpot: 100ms}}
  models:
  - name: m
    pools:
    - {name: d, hardwareClass: h200, engine: vllm, role: decode, maxConcurrency: 64, endpoints: ["10.0.1.1:1"]}
    - {name: p, hardwareClass: slowfill, engine: vllm, role: prefill, endpoints: ["10.0.0.1:1"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}
  tenants:
  - {name: pro, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// Under SLO placement a request is split onto a slower prefiller when the split still meets its TTFT target and
// the prefill costs less there; not when the split would be late, nor without predictions (affinity placement
// compares speeds only).
func TestSplitWhenCheaperInTime(t *testing.T) {
	doc := strings.Repeat("A long document the model must read before it answers. ", 400) // ≈ 5.6K tokens: 0.47 s at 12K/s + 0.07 s transfer
	pick := func(policy string) Decision {
		t.Helper()
		snap, m := modelOf(t, policy)
		pro, _ := snap.TenantForKey("sk-demo-acme")
		d, err := newMixedPicker(engines{"10.0.1.1:1": {}, "10.0.0.1:1": {}}).Pick(snap, Input{Tenant: pro, Model: m,
			Request: &openai.Request{Prompt: chatPrompt(t, doc, "?"), BodyBytes: len(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := pick(strings.Replace(twoPricePolicy, "TARGET", "5s", 1)); d.Prefill != "10.0.0.1:1" {
		t.Errorf("TTFT target 5 s: prefill %q, want the cheaper prefiller", d.Prefill)
	}
	if d := pick(strings.Replace(twoPricePolicy, "TARGET", "400ms", 1)); d.Prefill != "" {
		t.Errorf("TTFT target 0.4 s, which only the decoder meets: split to %q", d.Prefill)
	}
	if d := pick(strings.Replace(strings.Replace(twoPricePolicy, "TARGET", "5s", 1), "placement: slo", "placement: affinity", 1)); d.Prefill != "" {
		t.Errorf("affinity placement: split to the slower prefiller %q", d.Prefill)
	}
}

// A split request's TTFT fits neither its decoder's TTFT model nor its prefiller's: it is the prefiller's, the
// transfer and the decode leg's wait for a place in the decoder's batch together. Its TPOT fits the decoder's.
func TestSplitTimingTeachesOnlyTheDecodersTPOT(t *testing.T) {
	p := newMixedPicker(idleEngines(nil))
	dec := Decision{Endpoints: []string{"10.0.1.1:1"}, Prefill: "10.0.0.1:1", Predicted: Prediction{set: true}, prefillPred: Prediction{set: true}}
	p.ObserveTiming("m", dec, 90*time.Millisecond, 40*time.Millisecond)
	m, pf := p.pred.model("10.0.1.1:1", 0, 0, 0), p.pred.model("10.0.0.1:1", 0, 0, 0)
	if m.ttftSeen != 0 || m.tpotSeen != 1 || pf.ttftSeen != 0 || pf.ttft.n != 0 {
		t.Errorf("after a split request: the decoder saw %d TTFTs and %d TPOTs, the prefiller %v fitted TTFTs; want 0, 1 and 0",
			m.ttftSeen, m.tpotSeen, pf.ttft.n)
	}
	dec.Prefill, dec.prefillPred = "", Prediction{}
	p.ObserveTiming("m", dec, 90*time.Millisecond, 40*time.Millisecond)
	if m.ttftSeen != 1 || m.tpotSeen != 2 {
		t.Errorf("after a whole request: %d TTFTs, %d TPOTs seen; want 1 and 2", m.ttftSeen, m.tpotSeen)
	}
}

// Under SLO placement a split prompt is booked at its prefiller and stays booked at its decoder (predictSplit)
// until its first token passes, and the TTFT expected of it is the prefiller's prefill and the transfer.
func TestSplitPromptIsBookedAtBothEnds(t *testing.T) {
	policy := strings.Replace(strings.Replace(disaggPolicy, "routing: {debugScores: true}", "routing: {debugScores: true, placement: slo}", 1),
		"    pro: {}", "    pro: {slo: {ttft: 10s, tpot: 200ms}}", 1)
	snap, m := modelOf(t, policy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	p := newMixedPicker(idleEngines(nil))
	long := strings.Repeat("A long document the model must read before it answers. ", 400) // ≈ 5.6K tokens
	d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, long, "?"), BodyBytes: len(long)}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Prefill == "" || !d.Predicted.set {
		t.Fatalf("not split under SLO placement: prefill %q, predicted %v", d.Prefill, d.Predicted.set)
	}
	// 5.6K tokens at the H200's 24,000 a second, and 163,840 B a token over 100 Gb/s: about 0.31 s.
	if ttft := d.Predicted.TTFT; ttft < 200*time.Millisecond || ttft > 450*time.Millisecond {
		t.Errorf("predicted TTFT %v, want the split's prefill and transfer (about 0.31 s)", ttft)
	}
	for _, ep := range []string{d.Endpoints[0], d.Prefill} {
		if got := p.pred.eps[ep].aheadTokens(&scored{}, 0, d.Predicted.sentAt); got < 4000 {
			t.Errorf("%s books %.0f tokens of the split prompt, want about 5.6K", ep, got)
		}
	}
	// The prompt prefills on the prefiller: it counts in the prefiller's prefill share, not the decoder's.
	share := func(ep string) float64 { return p.pred.eps[ep].prefillShare(24000, d.Predicted.sentAt) }
	if dc, pf := share(d.Endpoints[0]), share(d.Prefill); dc != 0 || pf <= 0 {
		t.Errorf("prefill share at the decoder %.4f (want 0), at the prefiller %.4f (want more than 0)", dc, pf)
	}
	p.Prefilled(d)
	for _, ep := range []string{d.Endpoints[0], d.Prefill} {
		if got := p.pred.eps[ep].aheadTokens(&scored{}, 0, d.Predicted.sentAt); got != 0 {
			t.Errorf("%s still books %.0f tokens ahead once the first token passed", ep, got)
		}
	}
	// Its prefill stays in the prefiller's share: the decodes there shared its steps.
	if dc, pf := share(d.Endpoints[0]), share(d.Prefill); dc != 0 || pf <= 0 {
		t.Errorf("once prefilled: share at the decoder %.4f (want 0), at the prefiller %.4f (want more than 0)", dc, pf)
	}
}

// Under SLO placement the prefiller is the one predicted to prefill the prompt soonest; without predictions,
// the prompt's rendezvous winner.
func TestSLOPlacementPicksTheSoonestPrefiller(t *testing.T) {
	policy := strings.Replace(disaggPolicy, "role: prefill, endpoints:", "role: both, endpoints:", 1)
	snap, m := modelOf(t, policy)
	p := newMixedPicker(idleEngines(nil))
	pick := func(slo bool, ttft1, ttft2 time.Duration) string {
		d := &decision{p: p, snap: snap, in: Input{Model: m}, slo: slo, prompt: prompt{hashes: []uint64{42}}, routing: policies.Routing{MaxWaiting: 8},
			predicted: []scored{
				{endpoint: "10.0.0.1:1", pred: Prediction{set: true, TTFT: ttft1}},
				{endpoint: "10.0.0.2:1", pred: Prediction{set: true, TTFT: ttft2}},
			}}
		ep, _ := d.prefiller(policies.RoleBoth, "10.0.1.1:1", "")
		return ep
	}
	if got := pick(true, 2*time.Second, 300*time.Millisecond); got != "10.0.0.2:1" {
		t.Errorf("10.0.0.1 predicted 2 s, 10.0.0.2 0.3 s: chose %s", got)
	}
	if got := pick(true, 300*time.Millisecond, 2*time.Second); got != "10.0.0.1:1" {
		t.Errorf("10.0.0.1 predicted 0.3 s, 10.0.0.2 2 s: chose %s", got)
	}
	a, b := pick(false, 2*time.Second, 300*time.Millisecond), pick(false, 300*time.Millisecond, 2*time.Second)
	if a != b || a == "" {
		t.Errorf("without SLO placement the choice followed the predictions: %s, then %s", a, b)
	}
}

// sloDisaggPolicy is disaggPolicy under SLO placement: the H200 pool only prefills, so the candidates stage
// predicts none of its replicas.
var sloDisaggPolicy = strings.Replace(strings.Replace(disaggPolicy, "routing: {debugScores: true}", "routing: {debugScores: true, placement: slo}", 1),
	"    pro: {}", "    pro: {slo: {ttft: 10s, tpot: 200ms}}", 1)

// Under SLO placement the replicas of a prefill-only pool are predicted too: the split goes to the prefiller
// with the shorter queue, whichever it is (the prompt's rendezvous winner would be the same in both cases), and
// to the one whose cache holds the prompt's prefix when both are idle.
func TestSLOPlacementPredictsPrefillOnlyPools(t *testing.T) {
	snap, m := modelOf(t, sloDisaggPolicy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	now := time.Unix(1000, 0)
	doc := strings.Repeat("A long document the model must read before it answers. ", 400) // ≈ 5.6K tokens
	question := strings.Repeat("And a long question of its own, about all of it. ", 250)  // ≈ 3K tokens
	pick := func(p *Affinity, system, user string) Decision {
		t.Helper()
		now = now.Add(time.Minute) // the earlier legs' first tokens are long due
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, system, user), BodyBytes: len(system) + len(user)}})
		if err != nil {
			t.Fatal(err)
		}
		if d.Prefill == "" || !d.prefillPred.set {
			t.Fatalf("not split, or without a prediction of the prefill leg: prefill %q", d.Prefill)
		}
		return d
	}
	newPicker := func(busy string) *Affinity {
		p := newMixedPicker(idleEngines(func(ep string, m *fleet.EngineMetrics) {
			if ep == busy {
				m.Waiting, m.Running = 6, 6
			}
		}))
		p.Now = func() time.Time { return now }
		return p
	}
	var idleTTFT time.Duration
	for _, tc := range []struct{ busy, want string }{{"10.0.0.1:1", "10.0.0.2:1"}, {"10.0.0.2:1", "10.0.0.1:1"}} {
		d := pick(newPicker(tc.busy), doc, "?")
		if d.Prefill != tc.want {
			t.Errorf("%s queues six prompts: split to %s, want %s", tc.busy, d.Prefill, tc.want)
		}
		idleTTFT = d.prefillPred.TTFT
	}
	p := newPicker("10.0.0.1:1")
	first := pick(p, doc, "?")
	for ep, m := range p.Engines.(engines) {
		m.Waiting, m.Running = 0, 0
		p.Engines.(engines)[ep] = m
	}
	// Both idle now: the prompt's prefix is cached at the first one's prefiller only.
	if d := pick(p, doc, question); d.Prefill != first.Prefill || d.prefillPred.TTFT >= idleTTFT {
		t.Errorf("the prefix cached at %s: split to %s, predicted %v (uncached: %v)", first.Prefill, d.Prefill, d.prefillPred.TTFT, idleTTFT)
	}
	if d := pick(newPicker(""), doc, question); d.Prefill != "10.0.0.1:1" {
		t.Errorf("with nothing cached, both idle: split to %s, want the first listed", d.Prefill)
	}
}

// Under SLO placement a decoder whose predicted TPOT is past the target's margin is spared a prefill that a
// prefiller serves in time, even a dearer one: once the decoder has been seen slow, the request is split.
func TestSplitSparesADecoderPastItsTPOTMargin(t *testing.T) {
	policy := strings.Replace(strings.Replace(twoPricePolicy, "TARGET", "5s", 1), "slowfill: {costPerHour: 1,", "slowfill: {costPerHour: 10,", 1)
	snap, m := modelOf(t, policy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	doc := strings.Repeat("A long document the model must read before it answers. ", 400)
	p := newMixedPicker(engines{"10.0.1.1:1": {}, "10.0.0.1:1": {}})
	pick := func() Decision {
		t.Helper()
		d, err := p.Pick(snap, Input{Tenant: pro, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, doc+fmt.Sprint(len(p.pred.eps)), "?"), BodyBytes: len(doc)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := pick(); d.Prefill != "" {
		t.Fatalf("an idle decoder, a slower and dearer prefiller: split to %q", d.Prefill)
	}
	for range 50 { // the decoder's decodes take 95 ms a token, past 0.8 × the 100 ms target
		p.pred.observe("10.0.1.1:1", Prediction{tpotX: [fitDims]float64{1, 0}}, 0, 95*time.Millisecond)
	}
	p.Index = NewIndex() // the decoder holds nothing of the prompt
	if d := pick(); d.Prefill != "10.0.0.1:1" {
		t.Errorf("a decoder predicted at %v a token: prefill %q, want it spared", p.pred.eps["10.0.1.1:1"].tpot.predict([fitDims]float64{1, 0}), d.Prefill)
	}
}

// Under SLO placement the split weighs what the prefill does to the running decodes where it would run (chunked
// prefill: they share its steps). 48,000 tokens at 24,000 a second take 0.2 of the next 10 s: a replica
// decoding at 70 ms a token then decodes at 87.5 ms, past the 80 ms margin of a 100 ms target; one at 40 ms, at
// 50 ms. A prefill pool's replicas run no decodes. The split's TTFT is the prefiller's and the transfer, or the
// decoder's queue when its decode leg would wait there longer.
func TestSplitWeighsTheStallAtBothEnds(t *testing.T) {
	snap, m := modelOf(t, oneClassPolicy)
	both := m.Pools[0]
	prefill := both
	prefill.Role = policies.RolePrefill
	dg := &policies.Disaggregation{KVBytesPerToken: 1} // a transfer of microseconds
	type end struct {
		ttft, tpot, leg time.Duration
		running         float64
		cost            float64
	}
	cases := []struct {
		name        string
		decoder, pf end
		pool        *policies.Pool
		wantSplit   bool
		tokens      float64 // uncached; 48,000 when 0
	}{
		{"the prefill would stall the decoder's batch", end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1},
			end{ttft: time.Second, tpot: 40 * time.Millisecond, running: 10, cost: 1}, &both, true, 0},
		{"the same, the split late for its TTFT target", end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1},
			end{ttft: 6 * time.Second, tpot: 40 * time.Millisecond, running: 10, cost: 1}, &both, false, 0},
		{"the prefill would stall the prefiller's batch, however cheap", end{ttft: time.Second, tpot: 40 * time.Millisecond, running: 10, cost: 1},
			end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 0.1}, &both, false, 0},
		{"a prefill pool's replica decodes nothing", end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1},
			end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1}, &prefill, true, 0},
		{"as much stall at both ends, no sooner nor cheaper", end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1},
			end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1}, &both, false, 0},
		// 700,000 tokens take 29 s at 24,000 a second: more than a decode's 256 tokens at 100 ms (the last rule).
		{"a late split that spares the decoder a prefill longer than its decodes", end{ttft: time.Second, tpot: 70 * time.Millisecond, running: 10, cost: 1},
			end{ttft: 6 * time.Second, tpot: 40 * time.Millisecond, running: 10, cost: 1}, &both, true, 700000},
		{"no stall: sooner split", end{ttft: 3 * time.Second, leg: 100 * time.Millisecond, cost: 1},
			end{ttft: 500 * time.Millisecond, cost: 1}, &both, true, 0},
		{"no stall: the decode leg waits out the decoder's queue", end{ttft: 3 * time.Second, leg: 4 * time.Second, cost: 1},
			end{ttft: 500 * time.Millisecond, cost: 1}, &both, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tokens := tc.tokens
			if tokens == 0 {
				tokens = 48000
			}
			cand := func(ep string, pool *policies.Pool, e end) scored {
				return scored{endpoint: ep, pool: pool, prefillTPS: 24000, running: e.running,
					speed: policies.PoolSpeed{PrefillTokensPerSecond: 24000, CostPerHour: e.cost},
					pred:  Prediction{set: true, TTFT: e.ttft, TPOT: e.tpot, tpotStep: e.tpot, decodeLeg: e.leg, uncached: tokens}}
			}
			d := &decision{p: newMixedPicker(engines{}), snap: snap, in: Input{Model: m}, slo: true,
				targets: policies.Targets{TTFT: 5 * time.Second, TPOT: 100 * time.Millisecond}, routing: policies.Routing{SLOMargin: 0.8},
				predicted: []scored{cand("10.0.0.1:1", &both, tc.decoder), cand("10.0.0.2:1", tc.pool, tc.pf)}}
			if got, _ := d.worthSplitting("10.0.0.1:1", "10.0.0.2:1", tc.pool, int(tokens), dg); got != tc.wantSplit {
				t.Errorf("split %v, want %v", got, tc.wantSplit)
			}
		})
	}
}
