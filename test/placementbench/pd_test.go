package main

import (
	"slices"
	"testing"
	"time"
)

// The P/D bench's rows do what their names say on a short run: aggregated splits nothing, the fixed ratio
// splits every request (the H200s only prefill), the per-request choice splits some and not others (whether
// the H200s also serve whole requests or only prefill), and each
// serves nearly every request in time at a light load.
func TestPDRowsSplitAsTheirPoliciesSay(t *testing.T) {
	sc := newPDScenario(pdBase, 8, "slo")
	d := 20 * time.Second
	work := sc.pd.workload(d, 1)
	want := map[string]func(split float64) bool{
		rowAggregated:    func(s float64) bool { return s == 0 },
		rowDisaggregated: func(s float64) bool { return s == 1 },
		rowPerRequest:    func(s float64) bool { return s > 0 && s < 0.5 },
		// Every request may be split; those the H200s would serve late, or not cheaper, are not.
		rowPerRequestPrefill: func(s float64) bool { return s > 0.5 && s < 1 },
	}
	for _, row := range pdRows {
		run := measure(sc, newGateway(sc, row, 0, 1).run(work, d+30*time.Second), d, 1)
		if !want[row](run.split) || run.goodShare < 0.8 {
			t.Errorf("%s: %.0f %% split, %.0f %% within target", row, run.split*100, run.goodShare*100)
		}
	}
}

// The P/D family draws as many distinct fleets as asked, never the base fleet, the same ones for a seed, and
// stops at every fleet there is (4 × 5 × 6, less the base) rather than search for more.
func TestPDFamilyDrawsDistinctFleets(t *testing.T) {
	for _, tc := range []struct {
		n    int
		seed uint64
		want int
	}{{12, 33, 12}, {12, 34, 12}, {1, 7, 1}, {119, 33, 119}, {500, 33, 119}} {
		fleets := pdFamily(tc.n, tc.seed)
		if len(fleets) != tc.want {
			t.Errorf("pdFamily(%d, %d): %d fleets, want %d", tc.n, tc.seed, len(fleets), tc.want)
		}
		seen := map[pdFleet]bool{}
		for _, f := range fleets {
			if f == pdBase || seen[f] {
				t.Errorf("pdFamily(%d, %d): fleet %v is the base or a repeat", tc.n, tc.seed, f)
			}
			seen[f] = true
		}
		if again := pdFamily(tc.n, tc.seed); !slices.Equal(again, fleets) {
			t.Errorf("pdFamily(%d, %d) drew %v, then %v", tc.n, tc.seed, fleets, again)
		}
	}
	if slices.Equal(pdFamily(12, 33), pdFamily(12, 34)) {
		t.Error("seeds 33 and 34 drew the same family")
	}
}
