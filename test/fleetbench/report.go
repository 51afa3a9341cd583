package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// report prints the medians of every row and checks the targets against them.
func report(rows []string, results map[string][]result) {
	med := map[string]result{}
	fmt.Println("| policy | goodput (req/s) | goodput ratio | TTFT p50 | TTFT p95 | TPOT p95 | $ per 1M output tokens | right-sized $ per 1M | $ per 1M good output | managed share | managed TTFT p95 | cache-hit | failed | goodput / RR |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, name := range rows {
		rs := results[name]
		if len(rs) == 0 {
			continue
		}
		r := medianOf(rs)
		med[name] = r
		fmt.Printf("| %s | %.2f | %.1f%% | %s | %s | %s | %.3f | %.3f | %.3f | %.1f%% | %s | %.1f%% | %d | %.2f |\n", name, r.goodput,
			100*float64(r.good)/float64(max(r.requests, 1)), ms(r.ttftP50), ms(r.ttftP95), ms(r.tpotP95), r.usdPerMOut,
			r.rightSizedUSDPerMOut, r.usdPerGoodMOut,
			100*float64(r.managed)/float64(max(r.requests, 1)), ms(r.managedTTFTP95), 100*r.hit, r.failed,
			r.goodput/max(med["round-robin"].goodput, 1e-9))
	}
	slo, ok := med["infergate SLO+cost"]
	if !ok {
		return
	}
	fmt.Printf("\nTTFT prediction (SLO+cost, self-hosted requests): observed ÷ predicted p50 %.2f, p95 %.2f\n", slo.predP50, slo.predP95)
	fmt.Println("\nTargets:")
	check := loadgen.Check
	rr := med["round-robin"]
	check("goodput ≥ 1.5× round-robin", slo.goodput >= 1.5*rr.goodput, "%.2f×", slo.goodput/max(rr.goodput, 1e-9))
	if blind, ok := med["infergate cost-blind"]; ok {
		// Cost is judged per good output token (issue #33, which replaces #14's per-output-token target, shown by
		// its note not to be reachable on this ramp): for SLO placement as a platform team may run it, with the
		// managed API for what the fleet cannot serve in time, or with the fleet alone behind the admission queue.
		for _, row := range []string{"infergate SLO+cost", fleetOnly} {
			r, ok := med[row]
			if !ok {
				continue
			}
			saving, way := 1-r.usdPerGoodMOut/blind.usdPerGoodMOut, "below"
			if saving < 0 {
				way = "above"
			}
			check(row+": $ per 1M good output tokens ≤ cost-blind infergate's at equal or better goodput",
				saving >= 0 && r.goodput >= 0.99*blind.goodput, "%.0f%% %s, goodput %.2f×", 100*math.Abs(saving), way, r.goodput/max(blind.goodput, 1e-9))
		}
	}
	check("managed share 0 while self-hosted capacity remains (load rising under 0.9×, every run)", slo.managedAtLowLoad == 0,
		"%d requests in the worst run (%d while the peak's backlog drained under 0.9×)", slo.managedAtLowLoad, slo.managedAfterPeak)
	if slo.managed > 0 {
		fastest := time.Duration(0)
		for _, m := range models {
			if fastest == 0 || m.ttft < fastest {
				fastest = m.ttft
			}
		}
		check("managed overflow keeps TTFT p95 within SLO", slo.managedTTFTP95 <= fastest,
			"%s against the tightest target, %s", ms(slo.managedTTFTP95), ms(fastest))
	}
}

// medianOf takes each figure's median over runs (rows' runs alternate, so they share the machine's moods).
func medianOf(rs []result) result {
	med := func(f func(result) float64) float64 { return loadgen.Median(rs, f) }
	dur := func(f func(result) time.Duration) time.Duration {
		return time.Duration(med(func(r result) float64 { return float64(f(r)) }))
	}
	count := func(f func(result) int) int { return int(med(func(r result) float64 { return float64(f(r)) })) }
	return result{
		requests: count(func(r result) int { return r.requests }), good: count(func(r result) int { return r.good }),
		failed: count(func(r result) int { return r.failed }), managed: count(func(r result) int { return r.managed }),
		goodput: med(func(r result) float64 { return r.goodput }),
		ttftP50: dur(func(r result) time.Duration { return r.ttftP50 }), ttftP95: dur(func(r result) time.Duration { return r.ttftP95 }),
		tpotP95: dur(func(r result) time.Duration { return r.tpotP95 }), managedTTFTP95: dur(func(r result) time.Duration { return r.managedTTFTP95 }),
		usdPerMOut:           med(func(r result) float64 { return r.usdPerMOut }),
		rightSizedUSDPerMOut: med(func(r result) float64 { return r.rightSizedUSDPerMOut }),
		usdPerGoodMOut:       med(func(r result) float64 { return r.usdPerGoodMOut }), hit: med(func(r result) float64 { return r.hit }),
		managedAtLowLoad: slices.MaxFunc(rs, func(a, b result) int { return a.managedAtLowLoad - b.managedAtLowLoad }).managedAtLowLoad,
		managedAfterPeak: slices.MaxFunc(rs, func(a, b result) int { return a.managedAfterPeak - b.managedAfterPeak }).managedAfterPeak,
		predP50:          med(func(r result) float64 { return r.predP50 }), predP95: med(func(r result) float64 { return r.predP95 }),
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }
