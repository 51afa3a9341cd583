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

// The P/D family draws distinct fleets within its ranges, never the base fleet, and the same ones for a seed.
func TestPDFamilyDrawsDistinctFleets(t *testing.T) {
	fleets := pdFamily(12, 33)
	seen := map[pdFleet]bool{}
	for _, f := range fleets {
		if f == pdBase || seen[f] || f.h200 < 1 || f.h200 > 4 || f.l40s < 2 || f.l40s > 6 || f.gbps < 10 || f.gbps > 200 {
			t.Errorf("fleet %v: the base, a repeat or out of range", f)
		}
		seen[f] = true
	}
	if again := pdFamily(12, 33); !slices.Equal(again, fleets) {
		t.Errorf("seed 33 drew %v, then %v", fleets, again)
	}
	if other := pdFamily(12, 34); slices.Equal(other, fleets) {
		t.Error("seeds 33 and 34 drew the same family")
	}
}
