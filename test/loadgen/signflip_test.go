package loadgen

import (
	"math"
	"testing"
)

// The sign-flip test against hand-counted sign assignments, and its normal approximation past the exact bound.
func TestSignFlipBelow(t *testing.T) {
	cases := []struct {
		name  string
		diffs []int
		want  float64
	}{
		{"no runs", nil, 1},
		{"all equal", []int{0, 0, 0}, 1},
		{"every run behind", []int{-3, -1, -2, -5, -4}, 1.0 / 32},
		{"every run ahead", []int{3, 1, 2, 5, 4}, 1},
		// Sums of ±1 ±2 ±3 at most -4: (-1,-2,-3) -6, (+1,-2,-3) -4: 2 of 8.
		{"one run ahead", []int{1, -2, -3}, 2.0 / 8},
		// One run far behind and two a little ahead: sums of ±1 ±1 ±10 at most -8: every one with -10, 4 of 8.
		{"one run far behind", []int{1, 1, -10}, 4.0 / 8},
		{"a zero difference", []int{0, -1}, 2.0 / 4},
	}
	for _, tc := range cases {
		if got := SignFlipBelow(tc.diffs); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: SignFlipBelow(%v) = %.4f, want %.4f", tc.name, tc.diffs, got, tc.want)
		}
	}
	many := make([]int, maxExactSignFlips+5)
	for i := range many {
		many[i] = -1
	}
	if p := SignFlipBelow(many); p > 1e-5 {
		t.Errorf("%d runs all behind: p %.2g, want under 1e-5 (the normal approximation)", len(many), p)
	}
	many[0], many[1] = 30, 30
	if p := SignFlipBelow(many); p < 0.5 {
		t.Errorf("two runs far ahead of %d a little behind: p %.2g, want at least 0.5", len(many)-2, p)
	}
}
