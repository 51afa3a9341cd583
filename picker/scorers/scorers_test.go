package scorers

import (
	"math"
	"testing"
)

func TestDefaultScorers(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		c                           Candidate
		prefix, load, prefill, lora float64
	}{
		{"cold, idle, fast class", Candidate{PromptBlocks: 10, UncachedTokens: 6000, PrefillTokensPerSecond: 24000}, 0, 1, 0.25 / (0.25 + 0.25), 0},
		{"half cached", Candidate{PromptBlocks: 10, MatchedBlocks: 5, UncachedTokens: 3000, PrefillTokensPerSecond: 24000}, 0.5, 1, 0.25 / (0.125 + 0.25), 0},
		{"busiest of the candidates", Candidate{Load: 3, MaxLoad: 3, PrefillTokensPerSecond: 24000}, 0, 0.25, 1, 0},
		{"slow class, long prompt", Candidate{UncachedTokens: 70000, PrefillTokensPerSecond: 7000}, 0, 1, 0.25 / (10 + 0.25), 0},
		{"hardware speed unknown", Candidate{UncachedTokens: 70000}, 0, 1, 0, 0},
		{"adapter loaded", Candidate{PrefillTokensPerSecond: 7000, AdapterLoaded: true}, 0, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]float64{"prefix": tc.prefix, "load": tc.load, "prefill": tc.prefill, "lora": tc.lora}
			for _, s := range Default {
				if got := s.Score(tc.c); math.Abs(got-want[s.Name]) > 1e-9 {
					t.Errorf("%s = %v, want %v", s.Name, got, want[s.Name])
				}
			}
		})
	}
}

// The table is what the policy's weights, the validator and the debug header read: its names are unique, fit
// the picker's fixed array, and every score stays in [0,1] for extreme inputs.
func TestDefaultTable(t *testing.T) {
	if len(Default) > Max {
		t.Fatalf("%d scorers, the picker holds at most %d", len(Default), Max)
	}
	seen := map[string]bool{}
	for _, s := range Default {
		if s.Name == "" || seen[s.Name] || !Known(s.Name) || s.DefaultWeight < 0 {
			t.Errorf("scorer %+v: name empty, repeated or unknown, or a negative default", s)
		}
		seen[s.Name] = true
		for _, c := range []Candidate{{}, {PromptBlocks: 1, MatchedBlocks: 1, Load: 1 << 40, MaxLoad: 1 << 40, UncachedTokens: 1e12, PrefillTokensPerSecond: 1e-9, AdapterLoaded: true}} {
			if v := s.Score(c); v < 0 || v > 1 || math.IsNaN(v) {
				t.Errorf("%s scored %v for %+v", s.Name, v, c)
			}
		}
	}
	if Known("prefx") {
		t.Error("a misspelt scorer is known")
	}
}
