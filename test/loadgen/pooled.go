package loadgen

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Pooled quantiles compare two systems whose difference is smaller than how much one run's tail moves between
// runs on a shared machine: a median of per-run quantiles, each from a few dozen tail requests, decides a tight
// target by chance. The runs alternate between the systems, and each system's quantile is taken over all of
// its requests at once; drift over the minutes of a table then falls on both alike, and the quantile rests on
// every run's tail. A bootstrap over the runs (the same runs drawn for both, as they were measured side by
// side) says how far the ratio could move. Each argument holds one slice of latencies per run.

// MedianOfThirds splits the runs into three consecutive thirds, takes the ratio of on's to off's pooled
// q-quantile in each, and returns the median of the three: a burst of other work on the machine during one
// third moves one ratio, not the answer. With fewer than three runs it is the ratio of all runs pooled.
func MedianOfThirds(off, on [][]time.Duration, q float64) float64 {
	n := min(len(off), len(on))
	if n < 3 {
		return ratioOf(PooledQuantile(on, q), PooledQuantile(off, q))
	}
	var ratios []float64
	for k := range 3 {
		lo, hi := k*n/3, (k+1)*n/3
		ratios = append(ratios, ratioOf(PooledQuantile(on[lo:hi], q), PooledQuantile(off[lo:hi], q)))
	}
	slices.Sort(ratios)
	return ratios[1]
}

// PooledQuantile is the q-quantile of every latency of every run.
func PooledQuantile(runs [][]time.Duration, q float64) time.Duration {
	return Quantile(concat(runs, nil), q)
}

// RatioInterval is the 5th and 95th percentiles of on's pooled q-quantile ÷ off's over resamples of the runs
// drawn with replacement, the same draw for both sides. The seed is fixed, so a table is reproducible from
// its runs.
func RatioInterval(off, on [][]time.Duration, q float64) (lo, hi float64) {
	n := min(len(off), len(on))
	if n == 0 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ratios := make([]float64, 0, bootstrapRounds)
	picks := make([]int, n)
	for range bootstrapRounds {
		for i := range picks {
			picks[i] = rng.IntN(n)
		}
		a, b := Quantile(concat(off, picks), q), Quantile(concat(on, picks), q)
		if a > 0 {
			ratios = append(ratios, float64(b)/float64(a))
		}
	}
	if len(ratios) == 0 {
		return 0, 0
	}
	slices.Sort(ratios)
	return ratios[len(ratios)*5/100], ratios[min(len(ratios)-1, len(ratios)*95/100)]
}

// bootstrapRounds is how many resamples the interval is drawn from.
const bootstrapRounds = 200

func ratioOf(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// concat appends the latencies of runs[i] for every i in picks (all runs when picks is nil) to one slice.
func concat(runs [][]time.Duration, picks []int) []time.Duration {
	var all []time.Duration
	if picks == nil {
		for _, r := range runs {
			all = append(all, r...)
		}
		return all
	}
	for _, i := range picks {
		all = append(all, runs[i]...)
	}
	return all
}

// Quantile sorts v and returns its q-quantile (0 for no values): the benchmarks' one definition of it.
func Quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[min(len(v)-1, int(float64(len(v))*q))]
}
