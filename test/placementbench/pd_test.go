package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/test/loadgen"
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

// The A/A row is aggregated serving on endpoints named otherwise: the same policy but for the names, and it
// splits nothing.
func TestPDAARowIsAggregatedRenamed(t *testing.T) {
	sc := newPDScenario(pdBase, 8, "slo")
	endpoints := func(g *gateway) (eps [][]string) {
		for _, p := range g.model.Pools {
			eps = append(eps, p.Endpoints)
		}
		return eps
	}
	aa := newGateway(sc, rowAggregatedAA, 0, 1)
	policy := sc.pd.policyYAML(endpoints(newGateway(sc, rowAggregated, 0, 1)), rowAggregated)
	if got := sc.pd.policyYAML(endpoints(aa), rowAggregatedAA); strings.ReplaceAll(got, ":8001", ":8000") != policy || got == policy {
		t.Errorf("the A/A row's policy is not aggregated's under other names:\n%s\nagainst\n%s", got, policy)
	}
	d := 20 * time.Second
	if run := measure(sc, aa.run(sc.pd.workload(d, 1), d+30*time.Second), d, 1); run.split != 0 {
		t.Errorf("the A/A row split %.0f %% of requests", run.split*100)
	}
}

// A shortfall is judged over the seeds, paired: a row behind in every one of five is behind beyond chance
// (p 1/32), one behind overall by a seed's swing is not, however many requests the runs pooled.
func TestShortfallsArePairedBySeed(t *testing.T) {
	runs := func(goods ...int) []pdRun {
		var rs []pdRun
		for _, g := range goods {
			rs = append(rs, pdRun{good: g, arrived: 10000})
		}
		return rs
	}
	results := pdResults{
		8:  {rowPerRequest: runs(9990, 9990, 9990, 9990, 9990), rowAggregated: runs(9991, 9992, 9991, 9993, 9991)},
		36: {rowPerRequest: runs(8000, 8300, 8000, 8300, 8000), rowAggregated: runs(8150, 8200, 8150, 8200, 8150)},
		40: {rowPerRequest: runs(7000, 7000, 7000, 7000, 7000), rowAggregated: runs(7000, 7000, 7000, 7000, 7000)},
	}
	got := shortfalls([]float64{8, 36, 40}, results, rowPerRequest, rowAggregated)
	if len(got) != 2 || got[0].rate != 8 || got[1].rate != 36 {
		t.Fatalf("shortfalls at %+v, want at 8 and 36 req/s", got)
	}
	if math.Abs(got[0].p-1.0/32) > 1e-9 {
		t.Errorf("behind in every seed: p %.3f, want 1/32", got[0].p)
	}
	// 250 requests behind of 50,000, which Fisher's test on the pooled requests calls beyond chance.
	if pooledP := loadgen.FisherMore(50000-got[1].got, 50000, 50000-got[1].theirs, 50000); pooledP >= 0.05 || got[1].p < 0.05 {
		t.Errorf("behind by the seeds' swing: p %.3f (pooled Fisher %.4f), want ≥ 0.05 (and pooled under it)", got[1].p, pooledP)
	}
}
