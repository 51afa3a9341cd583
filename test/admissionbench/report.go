package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// result is one run of one variant.
type result struct {
	sent, good, served, degraded [3]float64 // per class, during the overload; good, served and degraded as shares of sent
	goodput                      float64    // good requests per second of the overload (simulated seconds)
	lost                         int        // requests that ended in neither a response nor a clear error
	ttftP95                      [3]time.Duration
	recovery                     time.Duration // after the overload, until its requests miss no more than calm's (recovery.go)
	peakHeap                     uint64
	peakQueue, peakQueueBytes    float64
	gatewayCPU                   cpuShare // the starved gateways' CPU during the overload
	// entMisses are the enterprise requests of the overload not good; entMissesEarly those of them sent in its
	// first onsetFor.
	entMisses, entMissesEarly int
}

// onsetFor is the start of an overload where its misses gather: at 3× capacity the batches fill in the first
// simulated second, the lower tiers to their headroom, and nothing that started then finishes before about
// 1.7 s (a full batch's 64 tokens), so the enterprise requests that come meanwhile wait for room.
const onsetFor = 3 * time.Second

func percentile(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, max(0, int(math.Ceil(p*float64(len(v))))-1))]
}

func ttfts(ss []sample) []time.Duration {
	var out []time.Duration
	for _, s := range ss {
		if s.status == 200 {
			out = append(out, s.ttft)
		}
	}
	return out
}

// summarise turns a run's samples into its result: the overload's shares and goodput by arrival, then how
// long after it the requests were back to calm's (recovery.go).
func (b *bench) summarise(v variant, samples []sample, start, calmFrom time.Time, calm calmFigures, p peak) result {
	scale := b.scale(v)
	sim := func(d time.Duration) time.Duration { return simulated(d, scale) }
	r := result{peakHeap: p.heap, peakQueue: p.queue, peakQueueBytes: p.bytes}
	var counts, good, served, degraded [3]int
	var lat [3][]time.Duration
	for _, s := range samples {
		if s.status == 0 || (s.status == 200 && !s.usage) {
			r.lost++
		}
		if s.sent.After(calmFrom) {
			continue
		}
		counts[s.class]++
		if s.class == 0 && !onTime(s, scale) {
			r.entMisses++
			if sim(s.sent.Sub(start)) < onsetFor {
				r.entMissesEarly++
			}
		}
		if s.status != 200 {
			continue
		}
		served[s.class]++
		lat[s.class] = append(lat[s.class], s.ttft)
		if strings.HasPrefix(s.replica, "small") {
			degraded[s.class]++
		}
		if onTime(s, scale) {
			good[s.class]++
		}
	}
	total := 0
	for i := range classes {
		n := float64(max(1, counts[i]))
		r.sent[i] = float64(counts[i])
		r.good[i], r.served[i], r.degraded[i] = float64(good[i])/n, float64(served[i])/n, float64(degraded[i])/n
		r.ttftP95[i] = sim(percentile(lat[i], 0.95))
		total += good[i]
	}
	r.goodput = float64(total) / (calmFrom.Sub(start).Seconds() / scale)
	r.recovery = sim(b.recovery(v, samples, calmFrom, calm))
	return r
}

// lateBySecond is, for each simulated second of the overload, how many enterprise requests sent in it were
// not good (failed, or a first token after the target) and how many were sent: whether the misses come in
// the overload's first seconds, while lower tiers still hold the room they took before it, or spread through it.
func lateBySecond(samples []sample, start, calmFrom time.Time, scale float64) string {
	n := int(math.Ceil(calmFrom.Sub(start).Seconds() / scale))
	late, sent := make([]int, n), make([]int, n)
	for _, s := range samples {
		if s.class != 0 || s.sent.Before(start) || !s.sent.Before(calmFrom) {
			continue
		}
		i := min(n-1, int(simulated(s.sent.Sub(start), scale).Seconds()))
		sent[i]++
		if !onTime(s, scale) {
			late[i]++
		}
	}
	parts := make([]string, n)
	for i := range n {
		parts[i] = fmt.Sprintf("%d/%d", late[i], sent[i])
	}
	return strings.Join(parts, " ")
}

// onTime says whether s was good: answered, its first token within its class's target (simulated time).
func onTime(s sample, scale float64) bool {
	return s.status == 200 && simulated(s.ttft, scale) <= classes[s.class].ttft
}

// simulated is the real duration d in the simulated time of a fleet running scale real seconds to its second.
func simulated(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) / scale)
}

func (b *bench) sim(d time.Duration) time.Duration { return simulated(d, b.timeScale) }

func (r result) summary() string {
	var s strings.Builder
	for i, c := range classes {
		fmt.Fprintf(&s, "%s good %.0f%% served %.0f%% · ", c.tier, 100*r.good[i], 100*r.served[i])
	}
	fmt.Fprintf(&s, "goodput %.1f/s, lost %d, recovery %v", r.goodput, r.lost, r.recovery)
	return s.String()
}

// peak is the most the process's heap and the gateways' queues held during a run.
type peak struct {
	heap         uint64
	queue, bytes float64
}

type peakWatch struct {
	mu   sync.Mutex
	p    peak
	stop func() peak
}

// watchPeaks samples the heap and the queues' gauges every 100 ms until stop, or every second when a gateway
// is a starved child process: each sample renders its whole /metrics, and ten a second took more of a starved
// gateway's CPU than its requests did (61 % of it in a CPU profile), which no Prometheus does.
func watchPeaks(ctx context.Context, reps []gatewayReplica) *peakWatch {
	w := &peakWatch{}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	every := 100 * time.Millisecond
	if slices.ContainsFunc(reps, func(r gatewayReplica) bool { return r.pid > 0 }) {
		every = time.Second
	}
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(heap)
			var q, qb float64
			for _, r := range reps {
				fams, _ := r.gather()
				for _, f := range fams {
					for _, m := range f.GetMetric() {
						switch f.GetName() {
						case "infergate_admission_queue_requests":
							q += m.GetGauge().GetValue()
						case "infergate_admission_queue_bytes":
							qb += m.GetGauge().GetValue()
						}
					}
				}
			}
			w.mu.Lock()
			w.p.heap, w.p.queue, w.p.bytes = max(w.p.heap, heap[0].Value.Uint64()), max(w.p.queue, q), max(w.p.bytes, qb)
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	w.stop = func() peak {
		cancel()
		<-done
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.p
	}
	return w
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// report prints the medians of each variant and the targets, then the A/A run's false alarms.
func (b *bench) report(out io.Writer, results map[string][]result, aa aaResult) {
	fmt.Fprintf(out, "Fleet: 2 H200 replicas of the large model (batch %d, %d output tokens), 1 L40S replica of the small one; "+
		"capacity %.1f requests/s of the large model (simulated), idle TTFT p95 %v. Tiers: enterprise %.0f%%, pro %.0f%%, "+
		"free %.0f%% of the load; TTFT targets %v, %v, %v. Medians of %d runs.\n\n",
		batch, maxTokens, b.capacity*b.timeScale, b.sim(b.uncontended), 100*classes[0].share, 100*classes[1].share,
		100*classes[2].share, classes[0].ttft, classes[1].ttft, classes[2].ttft, runsIn(results))
	defer aa.report(out)
	if len(results) == 0 {
		return // the A/A run alone
	}
	fmt.Fprintln(out, "| variant | enterprise good | pro served (degraded) | free served | TTFT p95 ent / pro / free | goodput | lost | recovery | peak queue | peak heap |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
	med := func(name string, f func(result) float64) float64 {
		if len(results[name]) == 0 {
			return 0
		}
		return loadgen.Median(results[name], f)
	}
	for _, v := range variants {
		rs := results[v.name]
		if len(rs) == 0 {
			continue
		}
		n := v.name
		fmt.Fprintf(out, "| %s | %.1f%% | %.1f%% (%.1f%%) | %.1f%% | %v / %v / %v | %.1f/s | %.0f | %v | %.0f (%.1f MiB) | %.0f MiB |\n", n,
			100*med(n, func(r result) float64 { return r.good[0] }),
			100*med(n, func(r result) float64 { return r.served[1] }), 100*med(n, func(r result) float64 { return r.degraded[1] }),
			100*med(n, func(r result) float64 { return r.served[2] }),
			time.Duration(med(n, func(r result) float64 { return float64(r.ttftP95[0]) })).Round(time.Millisecond),
			time.Duration(med(n, func(r result) float64 { return float64(r.ttftP95[1]) })).Round(time.Millisecond),
			time.Duration(med(n, func(r result) float64 { return float64(r.ttftP95[2]) })).Round(time.Millisecond),
			med(n, func(r result) float64 { return r.goodput }), med(n, func(r result) float64 { return float64(r.lost) }),
			time.Duration(med(n, func(r result) float64 { return float64(r.recovery) })).Round(10*time.Millisecond),
			med(n, func(r result) float64 { return r.peakQueue }), med(n, func(r result) float64 { return r.peakQueueBytes })/(1<<20),
			med(n, func(r result) float64 { return float64(r.peakHeap) })/(1<<20))
	}
	b.targets(out, results, med)
}

// targets prints each of the targets with the figures it compares: for the normal row and the starved
// one, and the goodput comparisons (which have no starved baselines) for the normal row.
func (b *bench) targets(out io.Writer, results map[string][]result, med func(string, func(result) float64) float64) {
	a := variantAdmission.name
	goodput := func(name string) float64 { return med(name, func(r result) float64 { return r.goodput }) }
	if len(results[a]) > 0 {
		fmt.Fprintln(out, "\nTargets (3× capacity, admission):")
		rowTargets(out, results, med, variantAdmission, variantTwo)
		if g1 := goodput(variantBaseline.name); len(results[variantBaseline.name]) > 0 {
			fmt.Fprintf(out, "- goodput at 3× %.1f/s ≥ 0.9 × at 1× %.1f/s (%.2f): %s\n", goodput(a), g1, goodput(a)/g1, verdict(goodput(a) >= 0.9*g1))
		}
		for _, other := range []string{variantDefault.name, variantFIFO.name} {
			if g := goodput(other); len(results[other]) > 0 {
				ratio := goodput(a) / math.Max(g, 1e-9)
				fmt.Fprintf(out, "- goodput %.1f/s ≥ 1.3 × %q %.1f/s (%.2f): %s\n", goodput(a), other, g, ratio, verdict(ratio >= 1.3))
			}
		}
	}
	if len(results[variantStarved.name]) > 0 || len(results[variantStarvedTwo.name]) > 0 {
		fmt.Fprintf(out, "\nTargets (3× capacity, admission, each gateway starved: GOMAXPROCS=1 at nice %d beside a busy loop on one CPU, engines %.0f× slower):\n",
			*starveNice, starveSlowdown)
		rowTargets(out, results, med, variantStarved, variantStarvedTwo)
		for _, v := range []variant{variantStarved, variantStarvedTwo} {
			if len(results[v.name]) > 0 {
				fmt.Fprintf(out, "- %s: each gateway used %.0f%% of a core and ran %.0f%% of the time it was ready to (medians)\n", v.name,
					100*med(v.name, func(r result) float64 { return r.gatewayCPU.cores }),
					100*med(v.name, func(r result) float64 { return r.gatewayCPU.share }))
			}
		}
	}
	lost := 0.0
	for _, rs := range results {
		for _, r := range rs {
			lost = max(lost, float64(r.lost))
		}
	}
	fmt.Fprintf(out, "\n- no request lost in any row (most in any run: %.0f): %s\n", lost, verdict(lost == 0))
}

// rowTargets prints the tier targets of one row: a gateway and two gateway replicas.
func rowTargets(out io.Writer, results map[string][]result, med func(string, func(result) float64) float64, one, two variant) {
	for _, v := range []variant{one, two} {
		n := v.name
		if len(results[n]) == 0 {
			continue
		}
		who := "one gateway"
		if v.replicas > 1 {
			who = fmt.Sprintf("%d gateway replicas", v.replicas)
		}
		entGood := med(n, func(r result) float64 { return r.good[0] })
		proServed := med(n, func(r result) float64 { return r.served[1] })
		shed := func(i int) float64 { return 1 - med(n, func(r result) float64 { return r.served[i] }) }
		var runs []string
		misses, early := 0, 0
		for _, r := range results[n] {
			runs = append(runs, fmt.Sprintf("%.0f", 100*r.good[0]))
			misses, early = misses+r.entMisses, early+r.entMissesEarly
		}
		fmt.Fprintf(out, "- %s: enterprise goodput %.1f%% ≥ 95%% (runs %s %%; of the %d misses, %d in the overload's first %v): %s\n",
			who, 100*entGood, strings.Join(runs, ", "), misses, early, onsetFor, verdict(entGood >= 0.95))
		fmt.Fprintf(out, "- %s: pro served %.1f%% ≥ 60%%: %s\n", who, 100*proServed, verdict(proServed >= 0.6))
		fmt.Fprintf(out, "- %s: free shed first (shed: free %.1f%%, pro %.1f%%, enterprise %.1f%%): %s\n", who, 100*shed(2), 100*shed(1), 100*shed(0),
			verdict(shed(2) >= shed(1) && shed(1) >= shed(0)))
		rec := time.Duration(med(n, func(r result) float64 { return float64(r.recovery) }))
		var recs []string
		for _, r := range results[n] {
			recs = append(recs, r.recovery.Round(10*time.Millisecond).String())
		}
		fmt.Fprintf(out, "- %s: back to calm (the next %v's requests fail or take over twice calm's median TTFT no more often "+
			"than calm's, one-sided Fisher p ≥ %.2f) %v after the overload (runs %s), ≤ 5s: %s\n", who, recoveryWindow, recoveryAlpha,
			rec.Round(10*time.Millisecond), strings.Join(recs, ", "), verdict(rec <= 5*time.Second))
	}
}

// runsIn is the most runs any variant had.
func runsIn(results map[string][]result) int {
	n := 0
	for _, rs := range results {
		n = max(n, len(rs))
	}
	return n
}
