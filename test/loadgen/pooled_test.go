package loadgen

import (
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPooledRatios(t *testing.T) {
	// Three runs per side; on is twice as slow in every run but the second, where the machine slowed off.
	off := [][]time.Duration{ms(10, 20, 30, 40), ms(50, 60, 70, 80), ms(10, 20, 30, 40)}
	on := [][]time.Duration{ms(20, 40, 60, 80), ms(50, 60, 70, 80), ms(20, 40, 60, 80)}
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"median of thirds, p50: the odd third is outvoted", MedianOfThirds(off, on, 0.5), 2},
		{"two runs pool", MedianOfThirds(off[:2], on[:2], 0.5), 60.0 / 50},
		{"no runs", MedianOfThirds(nil, nil, 0.5), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if got := PooledQuantile(off, 0.99); got != 80*time.Millisecond {
		t.Errorf("pooled p99 %v, want 80ms", got)
	}
	lo, hi := RatioInterval(off, on, 0.5)
	if lo < 1 || hi > 2 || lo > hi {
		t.Errorf("interval %.2f-%.2f, want within 1-2", lo, hi)
	}
	if lo, hi := RatioInterval(nil, nil, 0.5); lo != 0 || hi != 0 {
		t.Errorf("no runs: interval %v-%v", lo, hi)
	}
}
