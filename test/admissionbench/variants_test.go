package main

import (
	"slices"
	"testing"

	"github.com/infergate/infergate/policies"
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

// Every variant's policy is one infergate accepts: a check the policy validation adds (a reserve's, say) must
// not stop the benchmark only when it runs.
func TestVariantPoliciesAreValid(t *testing.T) {
	addrs := map[string]string{"big-0": "127.0.0.1:1", "big-1": "127.0.0.1:2", "small-0": "127.0.0.1:3"}
	for _, v := range append([]variant{variantCalibration}, variants...) {
		if _, err := policies.Parse(v.name+".yaml", []byte(v.policy(addrs, 1))); err != nil {
			t.Errorf("%s: %v", v.name, err)
		}
	}
}
