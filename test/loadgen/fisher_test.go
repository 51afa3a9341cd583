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
	}
	for _, tc := range tests {
		if got := FisherMore(tc.a, tc.n, tc.b, tc.m); math.Abs(got-tc.want) > 1e-3 {
			t.Errorf("%s: p %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
}
