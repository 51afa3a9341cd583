package picker

import (
	"math"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker/scorers"
)

// A new scorer is one entry of the table: with nothing else changed, it weighs in every decision, shows in the
// debug scores, and a policy weight of its name would set its weight (its default here).
func TestToyScorerThroughTheTableAlone(t *testing.T) {
	snap, m := mixed(t)
	// The toy prefers one endpoint, with a default weight that outweighs every other scorer.
	toy := scorers.Scorer{Name: "toy", DefaultWeight: 10, Score: func(c scorers.Candidate) float64 {
		if c.Load == 7 {
			return 1
		}
		return 0
	}}
	table := append(append([]scorers.Scorer{}, scorers.Default...), toy)
	// 10.0.1.2 is the only endpoint with a load of 7 (in flight + queue), and the busiest: without the toy the
	// load scorer sends the request elsewhere.
	eng := idleEngines(func(ep string, e *fleet.EngineMetrics) {
		if ep == "10.0.1.2:1" {
			e.Waiting = 7
		}
	})
	for _, tc := range []struct {
		name  string
		table []scorers.Scorer
		want  bool
	}{
		{"default table", nil, false},
		{"with the toy", table, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMixedPicker(eng)
			p.Scorers = tc.table
			d, err := p.Pick(snap, Input{Model: m, Request: request(t, "system prompt", "question")})
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Endpoints[0] == "10.0.1.2:1"; got != tc.want {
				t.Errorf("chose %v; the toy's endpoint first: %v, want %v", d.Endpoints, got, tc.want)
			}
			for _, s := range d.Scores {
				wantParts := len(scorers.Default)
				if tc.table != nil {
					wantParts++
				}
				if len(s.Parts) != wantParts {
					t.Fatalf("score %+v: %d parts, want %d", s, len(s.Parts), wantParts)
				}
				if tc.table != nil && s.Parts[len(s.Parts)-1].Scorer != "toy" {
					t.Errorf("the last part is %+v, want the toy's", s.Parts[len(s.Parts)-1])
				}
			}
		})
	}
}

// The policy's routing.weights set the table's weights by name; a scorer left out keeps its default.
func TestPolicyWeightsByName(t *testing.T) {
	for _, tc := range []struct {
		routing string
		want    [4]float64 // prefix, load, prefill, lora
	}{
		{`routing: {debugScores: true}`, [4]float64{2, 1, 1, 1}},
		{`routing: {debugScores: true, weights: {load: 0, lora: 3}}`, [4]float64{2, 0, 1, 3}},
		{`routing: {debugScores: true, prefixWeight: 5}`, [4]float64{5, 0, 1, 1}}, // the older spelling, as it always read
		{`routing: {debugScores: true, prefillWeight: 0, weights: {prefix: 1}}`, [4]float64{1, 1, 0, 1}},
	} {
		t.Run(tc.routing, func(t *testing.T) {
			snap, m := modelOf(t, strings.Replace(mixedPolicy, "routing: {debugScores: true}", tc.routing, 1))
			d := newMixedPicker(idleEngines(nil)).newDecision(snap, Input{Model: m})
			for i, s := range scorers.Default {
				if d.weights[i] != tc.want[i] {
					t.Errorf("%s weighs %v, want %v", s.Name, d.weights[i], tc.want[i])
				}
			}
		})
	}
}

// SLO placement prices the output the director's bound allows, which is what quota reserves: the policy's
// defaultMaxTokens for a request that asks none, not a figure of the picker's own.
func TestSLOPlacementPricesTheOutputBound(t *testing.T) {
	policy := strings.Replace(mixedPolicy, "  routing: {debugScores: true}\n",
		"  routing: {debugScores: true}\n  gateway: {defaultMaxTokens: 1024}\n  slo: {ttft: 30s}\n", 1)
	snap, m := modelOf(t, policy)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	cost := func(in Input) float64 {
		t.Helper()
		p := newMixedPicker(idleEngines(nil))
		in.Model, in.Tenant = m, pro
		d, err := p.Pick(snap, in)
		if err != nil || !d.Predicted.set {
			t.Fatalf("%+v, %v: want an SLO-placed decision", d, err)
		}
		return d.Predicted.CostUSD
	}
	ask := func(maxTokens int64) *openai.Request {
		r := request(t, "system prompt", "question")
		r.MaxTokens = maxTokens
		return r
	}
	// The cheapest SLO-meeting endpoint is an idle L40S: each output token costs its full batch share
	// (decodeShare with no batch size), 1.1 $/h ÷ 1200 tokens/s.
	perToken := 1.1 / 3600 / 1200
	unasked := cost(Input{Request: ask(0)})
	for _, tc := range []struct {
		name string
		in   Input
		out  float64
	}{
		{"the director's bound", Input{Request: ask(0), OutputTokens: 1024}, 1024},
		{"no bound passed: the policy's default, as the director computes it", Input{Request: ask(0)}, 1024},
		{"the client's max_tokens", Input{Request: ask(64), OutputTokens: 64}, 64},
		{"a bound below the client's ask (a context cap)", Input{Request: ask(4000), OutputTokens: 3000}, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cost(tc.in) - unasked
			if want := (tc.out - 1024) * perToken; math.Abs(got-want) > 1e-12 {
				t.Errorf("cost differs from the 1024-token default's by %.3g, want %.3g (%v output tokens)", got, want, tc.out)
			}
		})
	}
}
