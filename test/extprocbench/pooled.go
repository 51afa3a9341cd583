package main

import (
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// The telemetry rows compare two processors whose difference (a few per cent) is smaller than how much one
// run's p99 moves between runs, so they pool each side's requests over the interleaved runs (loadgen's
// pooled quantiles).

func medianOfThirds(off, on []result, q float64) float64 {
	return loadgen.MedianOfThirds(latencies(off), latencies(on), q)
}

func pooled(runs []result, q float64) time.Duration {
	return loadgen.PooledQuantile(latencies(runs), q)
}

func ratioInterval(off, on []result, q float64) (lo, hi float64) {
	return loadgen.RatioInterval(latencies(off), latencies(on), q)
}

func latencies(runs []result) [][]time.Duration {
	out := make([][]time.Duration, len(runs))
	for i, r := range runs {
		out[i] = r.latencies
	}
	return out
}
