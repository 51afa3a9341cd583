package picker

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// sortScored must order candidates exactly as sorting the records themselves did, ties included: placement's
// behaviour may not change with how the sort moves memory.
func TestSortScoredOrdersAsSortingTheRecords(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	byCostThenLoad := func(a, b *scored) int { // coarse keys: many ties
		if a.cost != b.cost {
			return cmpFloat(a.cost, b.cost)
		}
		return int(a.load - b.load)
	}
	for _, n := range []int{0, 1, 2, 5, 13, 64, 65, 200} {
		for _, stable := range []bool{false, true} {
			for trial := range 20 {
				cands := make([]scored, n)
				for i := range cands {
					cands[i] = scored{endpoint: string(rune('a' + i%26)), rank: uint64(i),
						cost: float64(rng.IntN(3)), load: int64(rng.IntN(4)), total: float64(rng.IntN(5)) / 4}
				}
				want := slices.Clone(cands)
				for _, cmp := range []func(a, b *scored) int{byCostThenLoad, byScore} {
					byValue := func(a, b scored) int { return cmp(&a, &b) }
					if stable {
						slices.SortStableFunc(want, byValue)
					} else {
						slices.SortFunc(want, byValue)
					}
					sortScored(cands, stable, cmp)
					for i := range want {
						if cands[i].rank != want[i].rank {
							t.Fatalf("n=%d stable=%v trial %d: position %d holds candidate %d, sorting the records put %d there",
								n, stable, trial, i, cands[i].rank, want[i].rank)
						}
					}
				}
			}
		}
	}
}
