package loadgen

import (
	"math"
	"testing"
)

// Fisher's exact test against hand-computed hypergeometric tails.
func TestFisherMore(t *testing.T) {
	tests := []struct {
		name       string
		a, n, b, m int
		want       float64
	}{
		{"one miss against none, equal sizes", 1, 3960, 0, 3960, 0.5},
		{"alike", 10, 100, 10, 100, 0.5929}, // P(X ≥ 10), X ~ Hypergeom(200, 20, 100)
		{"fewer than the other", 0, 100, 10, 100, 1},
		{"far above", 50, 100, 0, 100, 0},
		{"two misses against none", 2, 10, 0, 10, 0.2368}, // C(18,8)/C(20,10) = 43758/184756
		{"every one a miss in both", 5, 5, 5, 5, 1},
		{"none in the first", 0, 0, 3, 10, 1},
		{"none in the second", 3, 10, 0, 0, 1},
		{"every miss in the first, none in the second", 3, 3, 0, 7, 1.0 / 120}, // 1/C(10,3)
	}
	for _, tc := range tests {
		if got := FisherMore(tc.a, tc.n, tc.b, tc.m); math.Abs(got-tc.want) > 1e-3 {
			t.Errorf("%s: p %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
	for _, bad := range [][4]int{{-1, 10, 0, 10}, {11, 10, 0, 10}, {0, 10, 11, 10}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("FisherMore%v: no panic on counts that are not shares", bad)
				}
			}()
			FisherMore(bad[0], bad[1], bad[2], bad[3])
		}()
	}
}
