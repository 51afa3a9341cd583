package loadgen

import (
	"fmt"
	"math"
)

// FisherMore is the one-sided p-value of Fisher's exact test that the first sample's share of events (a of n)
// is above the second's (b of m): the chance, were both drawn alike, that the first would hold at least a of
// the a+b events. A benchmark that counts misses — requests late, failed or slower than a bound — compares
// two such shares with it, so that a difference of a request or two is told from a real one. The counts are
// the caller's own tallies: one that is not a share (a < 0, a > n, likewise b and m) is a bug in it.
func FisherMore(a, n, b, m int) float64 {
	if a < 0 || a > n || b < 0 || b > m {
		panic(fmt.Sprintf("loadgen.FisherMore: %d of %d against %d of %d are not shares", a, n, b, m))
	}
	k := a + b
	if a == 0 {
		return 1
	}
	p := 0.0
	for x := a; x <= min(k, n); x++ {
		if k-x <= m {
			p += math.Exp(logChoose(n, x) + logChoose(m, k-x) - logChoose(n+m, k))
		}
	}
	return min(1, p)
}

// logChoose is log C(n, k).
func logChoose(n, k int) float64 {
	x, _ := math.Lgamma(float64(n + 1))
	y, _ := math.Lgamma(float64(k + 1))
	z, _ := math.Lgamma(float64(n - k + 1))
	return x - y - z
}
