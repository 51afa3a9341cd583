package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// When an overload is over. The rule compares the requests sent after a point with those of the calm phase the
// run began with, at the same 0.5× load and configuration, as counts: a request misses when it fails or its
// TTFT is over twice the calm requests' median. Calm itself has a few such requests (at 0.5× a burst of
// arrivals fills a lower tier's headroom now and then, and its requests wait hundreds of milliseconds), so
// any high quantile of a few dozen calm requests lands either in the fast mode or in the slow one: the rule
// this replaced, a 1 s window's TTFT p95 within twice the calm p95, had a limit of 100 ms in one row and 1 s
// in the next, and judged windows of 2 to 16 requests by their slowest. Here the overload is over at the
// first point whose next recoveryWindow of requests are not more likely to miss than the calm ones, by a
// one-sided Fisher exact test. The A/A run (aa) shows how often each rule reads an overload where there was
// none.

// recoveryAlpha is the level at which the requests after a point are told to miss more than the calm ones.
const recoveryAlpha = 0.05

// recoveryWindow is the stretch after a point whose requests are judged: about 19 requests at 0.5× capacity,
// enough to tell a backlog's last slow ones from calm's share of them.
const recoveryWindow = 2 * time.Second

// recoveryMinimum is the fewest requests a window must hold to be judged (at 0.5× it holds about 19).
const recoveryMinimum = 10

// calmWarmup is how much of the calm phase is left out of its figures: the fleet starts it idle.
const calmWarmup = 2 * time.Second

// calmFigures are what the calm phase had: the TTFT over which a request misses (real time), and how many of
// its requests missed.
type calmFigures struct {
	bound        time.Duration
	missed, sent int
}

func calmOf(calm []sample) calmFigures {
	c := calmFigures{bound: 2 * percentile(ttfts(calm), 0.5), sent: len(calm)}
	c.missed = c.misses(calm)
	return c
}

func (c calmFigures) miss(s sample) bool { return s.status != 200 || s.ttft > c.bound }

// misses counts the samples that miss.
func (c calmFigures) misses(samples []sample) int {
	n := 0
	for _, s := range samples {
		if c.miss(s) {
			n++
		}
	}
	return n
}

// sentIn is the samples sent in [from, to).
func sentIn(samples []sample, from, to time.Time) []sample {
	var out []sample
	for _, s := range samples {
		if !s.sent.Before(from) && s.sent.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// recovery is how long after from (the overload's end) the requests sent in the next recoveryWindow stop
// missing more often than calm's (real time; the whole after phase when they never do). A window of about 20
// requests seldom passes by luck while a backlog's slow requests fill it, and a slow stretch later in the run
// (the machine's other work) does not undo it. It is no stricter than its test: against a calm with no misses
// a window of 19 passes with 2 (p 0.06), against 2 of 58 with 3, so it reads the end of a backlog while the
// last few of its requests are still in the window (1.75 s for a backlog of 2 s in the tests).
func (b *bench) recovery(v variant, samples []sample, from time.Time, calm calmFigures) time.Duration {
	after, window, step := b.stretch(v, b.after), b.stretch(v, recoveryWindow), b.stretch(v, 250*time.Millisecond)
	if calm.sent == 0 || calm.missed == calm.sent {
		return after // nothing to compare with
	}
	for at := from; !at.Add(window).After(from.Add(after)); at = at.Add(step) {
		if w := sentIn(samples, at, at.Add(window)); len(w) >= recoveryMinimum && !calm.worse(w) {
			return at.Sub(from)
		}
	}
	return after
}

// worse says whether the samples miss more often than calm's requests did (one-sided Fisher exact test at
// recoveryAlpha).
func (c calmFigures) worse(samples []sample) bool {
	return loadgen.FisherMore(c.misses(samples), len(samples), c.missed, c.sent) < recoveryAlpha
}

// windowRecovery is the rule this replaced, kept for the A/A run's comparison: how long after from the TTFT
// p95 of the requests answered in a 1 s window is within twice calmP95 (the p95 of the calm phase's last 3 s,
// at least twice the idle fleet's and 100 ms), with at least 3 in it (real time).
func (b *bench) windowRecovery(v variant, samples []sample, from time.Time, calmP95 time.Duration) time.Duration {
	limit := max(2*calmP95, 2*b.stretch(v, b.uncontended), 100*time.Millisecond)
	window, step, after := b.stretch(v, time.Second), b.stretch(v, 250*time.Millisecond), b.stretch(v, b.after)
	for at := from; at.Before(from.Add(after - window)); at = at.Add(step) {
		if w := ttfts(sentIn(samples, at, at.Add(window))); len(w) >= 3 && percentile(w, 0.95) <= limit {
			return at.Sub(from)
		}
	}
	return after
}

// oldCalmP95 is the limit's base of the rule recovery replaced: the TTFT p95 of the requests answered of those
// sent in the last 3 s before calmEnd.
func (b *bench) oldCalmP95(v variant, samples []sample, calmEnd time.Time) time.Duration {
	return percentile(ttfts(sentIn(samples, calmEnd.Add(-b.stretch(v, 3*time.Second)), calmEnd)), 0.95)
}

// recoveryTrace shows what recovery compared, for -v: calm's bound and misses, and the misses, requests and
// TTFT p95 of each simulated second after the overload.
func (b *bench) recoveryTrace(v variant, samples []sample, from time.Time, calm calmFigures) string {
	window := b.stretch(v, time.Second)
	parts := []string{fmt.Sprintf("over %v (twice calm's median), calm %d of %d:",
		simulated(calm.bound, b.scale(v)).Round(time.Millisecond), calm.missed, calm.sent)}
	for at := from; at.Before(from.Add(b.stretch(v, b.after))); at = at.Add(window) {
		w := sentIn(samples, at, at.Add(window))
		parts = append(parts, fmt.Sprintf("%d/%d (%v)", calm.misses(w), len(w), simulated(percentile(ttfts(w), 0.95), b.scale(v)).Round(time.Millisecond)))
	}
	return strings.Join(parts, " ")
}

// aaResult is what each rule read in each trial of the A/A run (simulated time).
type aaResult struct {
	rule, window []time.Duration
	spans        int // how many calm-and-after spans the run lasted
}

// aa measures the rules' false alarms: the one-gateway admission configuration at 0.5× and no overload for
// trials × (a calm and an after phase), judged as measure judges a run from every aaEvery on at which a calm
// and an after phase still fit: the trials overlap, so they are not independent, but each reads what a run
// without an overload would. Each should read 0.
func (b *bench) aa(ctx context.Context, trials int) (aaResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v := variantAdmission
	reps, err := b.stackFor(ctx, v)
	if err != nil {
		return aaResult{}, err
	}
	span, every := b.stretch(v, beforeFor+b.after), b.stretch(v, aaEvery)
	lg := newLoad(reps, v.singleTenant)
	start := time.Now()
	lg.open(ctx, 0.5*b.capacityOf(v), time.Duration(trials)*span)
	samples := lg.wait()
	var r aaResult
	for at := start; !at.Add(span).After(start.Add(time.Duration(trials) * span)); at = at.Add(every) {
		from := at.Add(b.stretch(v, beforeFor))
		calm := calmOf(sentIn(samples, at.Add(b.stretch(v, calmWarmup)), from))
		r.rule = append(r.rule, simulated(b.recovery(v, samples, from, calm), b.scale(v)))
		r.window = append(r.window, simulated(b.windowRecovery(v, samples, from, b.oldCalmP95(v, samples, from)), b.scale(v)))
	}
	r.spans = trials
	return r, nil
}

// aaEvery is how far apart the A/A run's trials start.
const aaEvery = 2 * time.Second

// aaName is what -only matches to run the A/A run.
const aaName = "A/A: 0.5× throughout, admission"

// report prints how often each rule read an overload where there was none, and the rule's target: more than 5 s
// (the recovery target) in at most 5 % of trials. At that rate a row's median of three runs reads more than 5 s
// by chance in under 1 % of tables (3 × 0.05²), and one of the table's four such rows in under 3 %, as far as
// the other rows' calm is like this one's. The trials overlap: a run of 12 spans is worth about 12 independent
// trials, so none in 100 bounds the rate only below about 20 %.
func (r aaResult) report(out io.Writer) {
	if len(r.rule) == 0 {
		return
	}
	reads := func(rs []time.Duration) (above0, above5 int, most time.Duration) {
		for _, x := range rs {
			above0 += btoi(x > 0)
			above5 += btoi(x > 5*time.Second)
			most = max(most, x)
		}
		return above0, above5, most
	}
	n := len(r.rule)
	fmt.Fprintf(out, "\nRecovery, %s (one gateway, no overload): %d trials of a calm and an after phase, one every %v of "+
		"a run of %d such spans:\n", aaName, n, aaEvery, r.spans)
	above0, above5, most := reads(r.rule)
	fmt.Fprintf(out, "- the rule (a %v window, Fisher p ≥ %.2f) read more than 0 in %d, at most %v; more than 5s in %d (%.1f%%) ≤ 5%%: %s\n",
		recoveryWindow, recoveryAlpha, above0, most.Round(10*time.Millisecond), above5, 100*float64(above5)/float64(n),
		verdict(float64(above5) <= 0.05*float64(n)))
	above0, above5, most = reads(r.window)
	fmt.Fprintf(out, "- the rule it replaced (a 1 s window's TTFT p95 within twice calm's) read more than 0 in %d, at most %v; "+
		"more than 5s in %d (%.1f%%)\n", above0, most.Round(10*time.Millisecond), above5, 100*float64(above5)/float64(n))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
