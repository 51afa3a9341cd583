package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The family is what its seed says: the same scenarios every time, and each of the four kinds holds its
// promise.
func TestFamilyIsDrawnFromItsSeed(t *testing.T) {
	for i := range 8 {
		a, b := generate(i, 33), generate(i, 33)
		if a.describe() != b.describe() {
			t.Fatalf("scenario %d differs between two draws:\n%s\n%s", i, a.describe(), b.describe())
		}
		s := &a
		if n := len(s.classes); n < 2 || n > 4 {
			t.Errorf("scenario %d: %d classes, want 2-4", i, n)
		}
		cheapest := s.cheapest()
		switch s.kind {
		case fastCheap:
			if s.classes[cheapest].speed.PrefillTokensPerSecond != s.maxPrefill() {
				t.Errorf("scenario %d (%s): the cheapest class is not the fastest", i, kindNames[s.kind])
			}
		case slowCheap:
			if s.classes[cheapest].speed.PrefillTokensPerSecond != s.minPrefill() {
				t.Errorf("scenario %d (%s): the cheapest class is not the slowest", i, kindNames[s.kind])
			}
		case cachedOnly:
			c := s.classes[cheapest]
			uncached := c.speed.StepOverhead + time.Duration(meanPrompt/c.speed.PrefillTokensPerSecond*float64(time.Second))
			if uncached <= s.ttft {
				t.Errorf("scenario %d (%s): the cheapest class meets %v for an uncached mean prompt (%v)", i, kindNames[s.kind], s.ttft, uncached)
			}
		case smallKV:
			if !slices.ContainsFunc(s.classes, func(c class) bool { return !c.holdsContext() }) {
				t.Errorf("scenario %d (%s): every class holds the longest request", i, kindNames[s.kind])
			}
		}
	}
}

// A run is reproducible — the discrete-event loop depends on nothing but its seeds — and accounts for every
// request: round-robin serves them all (it refuses nothing, and no class here is too small), and no row
// serves more than it was sent.
func TestRunsAreReproducibleAndAccountForEveryRequest(t *testing.T) {
	sc := generate(1, 33) // slow class cheaper, every class holds the longest request
	work := sc.workload(10*time.Second, 1)
	if len(work) == 0 {
		t.Fatal("no arrivals")
	}
	for _, row := range rows {
		first := newGateway(&sc, row, 0, 1).run(work, 10*time.Second)
		again := newGateway(&sc, row, 0, 1).run(work, 10*time.Second)
		if !slices.Equal(first, again) {
			t.Errorf("%s: two runs of one scenario and seed differ", row)
		}
		var r rowResult
		r.classShare = make([]float64, len(sc.classes))
		r.add(first, 0, nil, sc.ttft, sc.tpot)
		if r.requests != len(work) || r.served > r.requests || r.good > r.served {
			t.Errorf("%s: %d requests, %d served, %d good, of %d sent", row, r.requests, r.served, r.good, len(work))
		}
		if row == rowRR && r.served != len(work) {
			t.Errorf("round-robin served %d of %d", r.served, len(work))
		}
	}
}

// Fisher's exact test against hand-computed hypergeometric tails.
func TestFisherBelow(t *testing.T) {
	tests := []struct {
		name               string
		good, n, oGood, oN int
		want               float64
	}{
		{"one miss against none, equal sizes", 3959, 3960, 3960, 3960, 0.5},
		{"alike", 90, 100, 90, 100, 0.5929}, // P(X ≥ 10), X ~ Hypergeom(200, 20, 100)
		{"better than the other", 100, 100, 90, 100, 1},
		{"far below", 50, 100, 100, 100, 0},
		{"two misses against none", 8, 10, 10, 10, 0.2368}, // C(18,8)/C(20,10) = 43758/184756
	}
	for _, tc := range tests {
		r, o := &rowResult{good: tc.good, requests: tc.n}, &rowResult{good: tc.oGood, requests: tc.oN}
		if got := fisherBelow(r, o); math.Abs(got-tc.want) > 1e-3 {
			t.Errorf("%s: p %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
}

// -misstate makes the policy state the classes' speeds wrong in turn, too fast and too slow, and leaves the
// simulated engines as they are.
func TestMisstatedSpeedsAreOnlyStated(t *testing.T) {
	sc := generate(0, 33)
	right := sc.policyYAML(make([][]string, len(sc.classes)), "slo", false)
	sc.misstate = 2
	wrong := sc.policyYAML(make([][]string, len(sc.classes)), "slo", false)
	for i, c := range sc.classes {
		want := c.speed.PrefillTokensPerSecond * []float64{2, 0.5}[i%2]
		if stated := fmt.Sprintf("prefillTokensPerSecond: %.0f,", want); !strings.Contains(wrong, stated) {
			t.Errorf("class %s: the policy does not state %s:\n%s", c.name, stated, wrong)
		}
		if stated := fmt.Sprintf("prefillTokensPerSecond: %.0f,", c.speed.PrefillTokensPerSecond); !strings.Contains(right, stated) {
			t.Errorf("class %s: without -misstate the policy does not state its real speed", c.name)
		}
	}
	if got := generate(0, 33); got.classes[0].speed != sc.classes[0].speed {
		t.Error("misstating changed the simulated hardware")
	}
}

// Gateway replicas (-gateways) take requests in turn and learn each other's placements over the sim's bus: a
// run is reproducible, accounts for every request, and keeps about one replica's prefix-cache hits, more than
// replicas that decide apart (without Redis), each placing every group afresh.
func TestGatewayReplicasSharePlacements(t *testing.T) {
	sc := newPDScenario(pdBase, 8, "affinity") // 80 % of chat on eight groups' shared prefixes at a time
	work := sc.pd.workload(20*time.Second, 1)
	cachedShare := func(gateways int, apart bool) float64 {
		sc.gateways, sc.apart = gateways, apart
		first := newGateway(sc, rowAggregated, 0, 1).run(work, 30*time.Second)
		if again := newGateway(sc, rowAggregated, 0, 1).run(work, 30*time.Second); !slices.Equal(first, again) {
			t.Errorf("%d replicas: two runs of one scenario and seed differ", gateways)
		}
		var cached, prompt, served int
		for _, o := range first {
			if o.served {
				served++
				cached += o.cached
				prompt += o.prompt
			}
		}
		if served != len(work) {
			t.Errorf("%d replicas served %d of %d", gateways, served, len(work))
		}
		return float64(cached) / float64(max(1, prompt))
	}
	one, four, apart := cachedShare(1, false), cachedShare(4, false), cachedShare(4, true)
	t.Logf("prompt tokens cached: one replica %.3f, four sharing %.3f, four apart %.3f", one, four, apart)
	if four < one-0.02 || four <= apart {
		t.Errorf("four replicas sharing placements cached %.3f of prompt tokens, one %.3f, four apart %.3f", four, one, apart)
	}
}

// Four replicas under SLO placement tell each other of their long prompts: on the base P/D fleet at 4 chat
// requests a second, a replica that does not hear of another's 8-32K-token prompt in prefill on an H200 sends
// chat requests behind it, predicted in time, that miss their TTFT. With the news they are about as many in time
// as with one replica.
func TestReplicasHearOfEachOthersLongPrompts(t *testing.T) {
	sc := newPDScenario(pdBase, 4, "slo")
	inTime := func(gateways int, silent bool) int {
		sc.gateways, sc.silent = gateways, silent
		good := 0
		for seed := range uint64(3) {
			work := sc.pd.workload(time.Minute, seed+1)
			for _, o := range newGateway(sc, rowAggregated, 0, seed+1).run(work, 90*time.Second) {
				if o.good {
					good++
				}
			}
		}
		return good
	}
	one, heard, silent := inTime(1, false), inTime(4, false), inTime(4, true)
	t.Logf("requests in time over 3 seeds: one replica %d, four hearing of long prompts %d, four not %d", one, heard, silent)
	if heard <= silent || heard < one-5 {
		t.Errorf("in time: four replicas hearing of each other's long prompts %d, not hearing %d, one replica %d", heard, silent, one)
	}
}
