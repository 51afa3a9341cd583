package loadgen

import "math"

// maxExactSignFlips is the most paired differences SignFlipBelow enumerates every sign of (2^20 sums); past it,
// the sum's normal approximation.
const maxExactSignFlips = 20

// SignFlipBelow is the one-sided p-value of a paired sign-flip (permutation) test that the first of two rows
// does worse than the second, from their differences run by run (first − second, on the same arrivals): the
// chance, were the rows alike so that each difference were as likely negated, that the differences would sum
// to at most what they do. Where the requests of one run are not independent — past a fleet's capacity a few
// decisions set the course of the rest — a test over pooled requests (FisherMore) calls chance significant;
// the runs are the independent samples. With n runs that differ its least value is 2^-n: five arrival seeds never
// reach below 0.03.
func SignFlipBelow(diffs []int) float64 {
	obs := 0.0
	for _, d := range diffs {
		obs += float64(d)
	}
	n := len(diffs)
	if n > maxExactSignFlips {
		sq := 0.0
		for _, d := range diffs {
			sq += float64(d) * float64(d)
		}
		if sq == 0 {
			return 1 // every run alike
		}
		return 0.5 * math.Erfc(-obs/math.Sqrt(2*sq))
	}
	atMost := 0
	for signs := range 1 << n {
		sum := 0.0
		for k, d := range diffs {
			v := math.Abs(float64(d))
			if signs&(1<<k) != 0 {
				v = -v
			}
			sum += v
		}
		if sum <= obs {
			atMost++
		}
	}
	return float64(atMost) / float64(int(1)<<n)
}
