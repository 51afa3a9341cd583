package main

import (
	"slices"
	"testing"
)

// -only picks a variant by its whole name, or every variant whose name contains it.
func TestOnlySelects(t *testing.T) {
	tests := []struct {
		only string
		want []string
	}{
		{"", []string{variantBaseline.name, variantDefault.name, variantFIFO.name, variantAdmission.name, variantTwo.name,
			variantStarved.name, variantStarvedTwo.name}},
		{variantAdmission.name, []string{variantAdmission.name}},
		{"starved", []string{variantStarved.name, variantStarvedTwo.name}},
		{"no such variant", nil},
	}
	for _, tc := range tests {
		var got []string
		for _, v := range variants {
			if v.selected(tc.only) {
				got = append(got, v.name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("-only %q: %q, want %q", tc.only, got, tc.want)
		}
	}
}
