// Package latency is a small log-bucket histogram for the sliding windows that judge latency from the
// gateway's own measurements (a rollout's gates, the autoscaling signal): small enough to keep one per second
// of a window, fine enough for a p95 within 10 %.
package latency

import (
	"math"
	"time"
)

// Buckets grow by 10 % from 1 ms (bucket 0): 145 of them reach about 900 s, where the last one catches
// everything longer.
const (
	Buckets = 145
	base    = 1.1
	floor   = time.Millisecond
)

// Histogram counts durations in Buckets log-spaced buckets.
type Histogram [Buckets]uint32

func bucketOf(d time.Duration) int {
	if d <= floor {
		return 0
	}
	return min(Buckets-1, int(math.Log(float64(d)/float64(floor))/math.Log(base))+1)
}

// upper is the upper bound of a bucket, the value a quantile falling in it reports.
func upper(b int) time.Duration { return time.Duration(float64(floor) * math.Pow(base, float64(b))) }

// Add counts one duration.
func (h *Histogram) Add(d time.Duration) { h[bucketOf(d)]++ }

// Merge adds another histogram's counts.
func (h *Histogram) Merge(o *Histogram) {
	for b, c := range o {
		h[b] += c
	}
}

// Quantile is the upper bound of the bucket holding the q-th sample (0 without samples).
func (h *Histogram) Quantile(q float64) time.Duration {
	var n uint64
	for _, c := range h {
		n += uint64(c)
	}
	if n == 0 {
		return 0
	}
	rank, seen := uint64(math.Ceil(q*float64(n))), uint64(0)
	for b, c := range h {
		if seen += uint64(c); seen >= rank {
			return upper(b)
		}
	}
	return upper(Buckets - 1)
}
