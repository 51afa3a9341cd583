package main

import (
	"fmt"
	"log"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/test/loadgen"
)

// Issue #40's targets for the main table, each cell against the no-op floor measured in the same runs.
const (
	minRPSRatio = 0.9 // 2 and 32 KiB: requests/s at least this share of the floor's
	maxP99Ratio = 1.2 // every cell: p99 at most this multiple of the floor's
	// allocsBefore is the processor's own allocations per decision (its requests' allocations less the
	// floor's, in the same harness) before issue #40's savings: the median over the rows of the main table in
	// BENCHMARKS.md ("ext_proc decision latency against a no-op floor"). The target is at most half of it.
	allocsBefore = 144.0
)

// mainConfigs are the main table's cells: the 2 and 32 KiB × 1, 8 and 32 streams, and 256 KiB, in
// both body modes.
func mainConfigs(scale float64) []config {
	var out []config
	for _, size := range []int{2 << 10, 32 << 10, 256 << 10} {
		n := map[int]int{2 << 10: 4000, 32 << 10: 2000, 256 << 10: 400}[size]
		conc := []int{1, 8, 32}
		if size == 256<<10 {
			conc = []int{1, 32}
		}
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED} {
			for _, c := range conc {
				out = append(out, config{promptBytes: size, mode: mode, concurrency: c, requests: max(64, int(float64(n)*scale))})
			}
		}
	}
	return out
}

// rowResult is one cell: infergate's and the floor's medians and the medians of their per-run ratios.
type rowResult struct {
	cfg                config
	med, floor         result
	rpsRatio, p99Ratio float64
	// allocs is the processor's own allocations per decision: its requests' less the floor's.
	allocs float64
}

// throughputTarget says whether the cell has a requests/s target (256 KiB has only its p99's).
func (r rowResult) throughputTarget() bool { return r.cfg.promptBytes < 256<<10 }

func (r rowResult) met() bool {
	return r.p99Ratio <= maxP99Ratio && (!r.throughputTarget() || r.rpsRatio >= minRPSRatio)
}

func (r rowResult) verdict() string {
	if r.met() {
		return "met"
	}
	return "not met"
}

// measureRow runs infergate and the floor interleaved, runs times each, so both see the same machine.
func measureRow(client, floor extprocv3.ExternalProcessorClient, cfg config, runs, chunk int) rowResult {
	body := chatBody(cfg.promptBytes)
	var rs, fs []result
	var rpsRatios, p99Ratios, allocs []float64
	for range runs {
		r, err := measure(client, cfg, body, chunk)
		if err != nil {
			log.Fatalf("%+v: %v", cfg, err)
		}
		f, err := measure(floor, cfg, body, chunk)
		if err != nil {
			log.Fatalf("floor %+v: %v", cfg, err)
		}
		rs, fs = append(rs, r), append(fs, f)
		rpsRatios = append(rpsRatios, r.rps/f.rps)
		p99Ratios = append(p99Ratios, float64(r.p99)/float64(f.p99))
		allocs = append(allocs, r.allocsPerRq-f.allocsPerRq)
	}
	id := func(v float64) float64 { return v }
	return rowResult{cfg: cfg, med: medianResult(rs), floor: medianResult(fs),
		rpsRatio: loadgen.Median(rpsRatios, id), p99Ratio: loadgen.Median(p99Ratios, id), allocs: loadgen.Median(allocs, id)}
}

// checkHotPath prints issue #40's targets over the rows measured.
func checkHotPath(rows []rowResult) {
	if len(rows) == 0 {
		return
	}
	worstRPS, worstP99, metRows := 1e9, 0.0, 0
	var allocs []float64
	for _, r := range rows {
		if r.throughputTarget() {
			worstRPS = min(worstRPS, r.rpsRatio)
		}
		worstP99 = max(worstP99, r.p99Ratio)
		allocs = append(allocs, r.allocs)
		if r.met() {
			metRows++
		}
	}
	fmt.Println()
	loadgen.Check(fmt.Sprintf("requests/s ≥ %.1f× the floor's, every 2 and 32 KiB cell", minRPSRatio), worstRPS >= minRPSRatio, "worst %.2f×", worstRPS)
	loadgen.Check(fmt.Sprintf("p99 ≤ %.1f× the floor's, every cell (256 KiB included)", maxP99Ratio), worstP99 <= maxP99Ratio, "worst %.2f×; %d of %d cells meet both", worstP99, metRows, len(rows))
	med := loadgen.Median(allocs, func(v float64) float64 { return v })
	if allocsBefore > 0 {
		loadgen.Check("allocations per decision ≤ half of those before issue #40", med <= allocsBefore/2, "median %.0f against %.0f before", med, allocsBefore)
	} else {
		fmt.Printf("- allocations per decision: median %.0f over the rows\n", med)
	}
}
