package main

import (
	"testing"
	"time"
)

// The recovery rule on runs made to order: calm's 58 requests with 2 slow ones, then an after phase of a
// request every 100 ms (of the fleet's time) whose first requests are slow or fail (a backlog) and whose rest
// are like calm. It reads at most a few requests early; calm's own share of slow requests does not move it, nor
// does a slow stretch after it has read; a window too sparse to judge, or a calm with nothing to compare,
// reads the whole after phase.
func TestRecoveryFollowsTheBacklog(t *testing.T) {
	const fast, slow = 50 * time.Millisecond, 400 * time.Millisecond
	at := time.Unix(1000, 0)
	calmOfScale := func(scale float64, ttft time.Duration, status int) calmFigures {
		var calm []sample
		for i := range 58 {
			calm = append(calm, sample{sent: at.Add(time.Duration(float64(i) * scale * float64(100*time.Millisecond))),
				status: status, ttft: ttft})
		}
		calm[10].ttft, calm[40].ttft = slow, slow
		return calmOf(calm)
	}
	from := at.Add(20 * time.Second)
	type phase struct {
		backlog    time.Duration
		every      int  // one request in every this many is slow after the backlog (0: none)
		failed     bool // the backlog's requests fail instead of being slow
		slow       [2]int
		spacing    time.Duration // between requests (100 ms when 0)
		starvation float64       // the engines' slowdown (1 when 0)
	}
	after := func(p phase) []sample {
		scale := max(1, p.starvation)
		spacing := time.Duration(scale * float64(max(p.spacing, 100*time.Millisecond)))
		var out []sample
		for i := 0; time.Duration(i)*spacing < time.Duration(scale*float64(10*time.Second)); i++ {
			s := sample{sent: from.Add(time.Duration(i) * spacing), status: 200, ttft: time.Duration(scale * float64(fast))}
			inBacklog := s.sent.Sub(from) < time.Duration(scale*float64(p.backlog))
			switch {
			case inBacklog && p.failed:
				s.status = 429
			case inBacklog:
				s.ttft = time.Duration(scale * float64(time.Second))
			case p.every > 0 && i%p.every == 0, i >= p.slow[0] && i < p.slow[1]:
				s.ttft = time.Duration(scale * float64(slow))
			}
			out = append(out, s)
		}
		return out
	}
	tests := []struct {
		name     string
		after    phase
		calm     calmFigures
		from, to time.Duration // where recovery must read (real time)
	}{
		{"no backlog", phase{}, calmOfScale(1, fast, 200), 0, 0},
		{"no backlog, calm's share of slow requests", phase{every: 30}, calmOfScale(1, fast, 200), 0, 0},
		{"two slow requests in the first window", phase{slow: [2]int{0, 2}}, calmOfScale(1, fast, 200), 0, 0},
		{"four slow requests in the first 400 ms", phase{slow: [2]int{0, 4}}, calmOfScale(1, fast, 200),
			250 * time.Millisecond, 250 * time.Millisecond},
		{"a 2 s backlog", phase{backlog: 2 * time.Second, every: 30}, calmOfScale(1, fast, 200),
			1500 * time.Millisecond, 2 * time.Second},
		{"a 2 s backlog of failures", phase{backlog: 2 * time.Second, every: 30, failed: true}, calmOfScale(1, fast, 200),
			1500 * time.Millisecond, 2 * time.Second},
		{"a 4 s backlog", phase{backlog: 4 * time.Second, every: 30}, calmOfScale(1, fast, 200),
			3500 * time.Millisecond, 4 * time.Second},
		{"a 2 s backlog, then 2 s slow from 7 s (other work on the machine)", phase{backlog: 2 * time.Second, every: 30,
			slow: [2]int{70, 90}}, calmOfScale(1, fast, 200), 1500 * time.Millisecond, 2 * time.Second},
		{"a slow request in four: never back", phase{every: 4}, calmOfScale(1, fast, 200), 10 * time.Second, 10 * time.Second},
		{"a request every 300 ms: too few to judge", phase{spacing: 300 * time.Millisecond}, calmOfScale(1, fast, 200),
			10 * time.Second, 10 * time.Second},
		{"every calm request failed: nothing to compare", phase{}, calmOfScale(1, fast, 503), 10 * time.Second, 10 * time.Second},
		{"starved: a 2 s backlog on engines at half speed", phase{backlog: 2 * time.Second, every: 30, starvation: starveSlowdown},
			calmOfScale(starveSlowdown, time.Duration(starveSlowdown*float64(fast)), 200), 3 * time.Second, 4 * time.Second},
	}
	b := &bench{timeScale: 1, after: 10 * time.Second}
	for _, tc := range tests {
		v := variantAdmission
		if tc.after.starvation > 0 {
			v = variantStarved
		}
		got := b.recovery(v, after(tc.after), from, tc.calm)
		if got < tc.from || got > tc.to {
			t.Errorf("%s: recovery %v, want %v to %v", tc.name, got, tc.from, tc.to)
		}
	}
}
