package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// request is one arrival of a scenario's workload.
type request struct {
	at           time.Duration // simulated offset from the run's start
	system, user []string      // tokens: a shared group's prefix (or the request's own), then its own
	output       int
	group        int  // the prefix group, -1 for an unshared prompt
	long         bool // a long prompt of a burst (the P/D bench), judged by pdScenario.longTTFT
}

// group is a shared prefix and how many more requests will open with it.
type group struct {
	id     int
	prefix []string
	left   int
}

// workload draws a scenario's arrivals from an arrival seed: Poisson arrivals at the scenario's load (constant,
// or ramped up over the first half and down over the second, drawn by thinning at the peak), a share of them
// opening with one of the active groups' shared prefixes. A group lives for a number of requests drawn around
// the scenario's mean group size (1-64) and is replaced by a new one when done, so groups start, grow warm
// and end throughout the run.
func (s *scenario) workload(d time.Duration, arrivalSeed uint64) []request {
	rng := rand.New(rand.NewPCG(s.seed^0x9e3779b97f4a7c15, arrivalSeed*1000+uint64(s.id)))
	peak := s.loadLo
	if s.ramped {
		peak = s.loadHi
	}
	peakRate := peak * s.capacity()
	var groups []*group
	next := 0
	newGroup := func() *group {
		g := &group{id: next, prefix: words(fmt.Sprintf("g%d-%d-", arrivalSeed, next), 400+rng.IntN(601)),
			left: min(64, 1+int(math.Round(rng.ExpFloat64()*(s.groupMean-1))))}
		next++
		return g
	}
	for range s.activeGroup {
		groups = append(groups, newGroup())
	}
	var out []request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / peakRate * float64(time.Second))
		if t >= d {
			return out
		}
		if rate := s.loadAt(float64(t) / float64(d)); rng.Float64() > rate/peak {
			continue
		}
		prompt := minPrompt + rng.IntN(maxPrompt-minPrompt+1)
		r := request{at: t, output: minOutput + rng.IntN(maxOutput-minOutput+1), group: -1}
		tag := fmt.Sprintf("r%d-%d-", arrivalSeed, len(out))
		if rng.Float64() < s.shared {
			i := rng.IntN(len(groups))
			g := groups[i]
			r.group, r.system = g.id, g.prefix
			r.user = words(tag, max(50, prompt-len(g.prefix)))
			if g.left--; g.left <= 0 {
				groups[i] = newGroup()
			}
		} else {
			r.system, r.user = words(tag+"s", prompt/3), words(tag+"u", prompt-prompt/3)
		}
		out = append(out, r)
	}
}

// loadAt is the load factor at a phase (0..1) of the run.
func (s *scenario) loadAt(phase float64) float64 {
	if !s.ramped {
		return s.loadLo
	}
	return s.loadLo + (s.loadHi-s.loadLo)*2*min(phase, 1-phase)
}

// words is n distinct tokens named after tag.
func words(tag string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return out
}
