package main

import (
	"testing"
	"time"
)

// The P/D bench's rows do what their names say on a short run: aggregated splits nothing, the fixed ratio
// splits every request (the H200s only prefill), the per-request choice splits some and not others (whether
// the H200s also serve whole requests or only prefill), and each
// serves nearly every request in time at a light load.
func TestPDRowsSplitAsTheirPoliciesSay(t *testing.T) {
	sc := newPDScenario(8, "slo")
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
