package main

import (
	"testing"
	"time"
)

// The recovery rule on runs made to order: calm's 58 requests with 2 slow ones, then an after phase of a
// request every 100 ms whose first requests are slow or fail (a backlog) and whose rest are like calm. It
// reads at most a few requests early, and neither a late slow stretch nor calm's own share of slow requests
// moves it.
func TestRecoveryFollowsTheBacklog(t *testing.T) {
	const fast, slow = 50 * time.Millisecond, 400 * time.Millisecond
	at := time.Unix(1000, 0)
	var calm []sample
	for i := range 58 {
		calm = append(calm, sample{sent: at.Add(time.Duration(i) * 100 * time.Millisecond), status: 200, ttft: fast})
	}
	calm[10].ttft, calm[40].ttft = slow, slow
	from := at.Add(10 * time.Second)
	after := func(backlog time.Duration, every int, failed bool) []sample {
		var out []sample
		for i := range 100 {
			s := sample{sent: from.Add(time.Duration(i) * 100 * time.Millisecond), status: 200, ttft: fast}
			switch {
			case s.sent.Sub(from) < backlog && failed:
				s.status = 429
			case s.sent.Sub(from) < backlog:
				s.ttft = time.Second
			case every > 0 && i%every == 0:
				s.ttft = slow
			}
			out = append(out, s)
		}
		return out
	}
	burst := func(ss []sample, from, to int) []sample {
		for i := from; i < to; i++ {
			ss[i].ttft = slow
		}
		return ss
	}
	b := &bench{timeScale: 1, after: 10 * time.Second}
	tests := []struct {
		name     string
		samples  []sample
		from, to time.Duration // where recovery must read
	}{
		{"no backlog", after(0, 0, false), 0, 0},
		{"no backlog, calm's share of slow requests", after(0, 30, false), 0, 0},
		{"a 2 s backlog", after(2*time.Second, 30, false), 1500 * time.Millisecond, 2 * time.Second},
		{"a 2 s backlog of failures", after(2*time.Second, 30, true), 1500 * time.Millisecond, 2 * time.Second},
		{"a 4 s backlog", after(4*time.Second, 30, false), 3500 * time.Millisecond, 4 * time.Second},
		{"a burst of slow requests late in a calm after phase", burst(after(0, 0, false), 70, 73), 0, 0},
		{"a 2 s backlog, and 2 s slow later (other work on the machine)", burst(after(2*time.Second, 30, false), 70, 90),
			1500 * time.Millisecond, 2 * time.Second},
		{"a slow request in four: never back", after(0, 4, false), 10 * time.Second, 10 * time.Second},
	}
	for _, tc := range tests {
		got := b.recovery(variantAdmission, tc.samples, from, calmOf(calm))
		if got < tc.from || got > tc.to {
			t.Errorf("%s: recovery %v, want %v to %v", tc.name, got, tc.from, tc.to)
		}
	}
}
