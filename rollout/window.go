// Package rollout releases a model's candidate in steps: it measures the candidate and the baseline over the
// same window from the gateway's own settlements, compares them with the policy's gates and moves the
// rollout's state — advance, hold, roll back — which the director reads as the candidate's share of traffic.
package rollout

import (
	"sync"
	"time"

	"github.com/infergate/infergate/latency"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/picker"
)

// Summary is one arm's requests over a window.
type Summary struct {
	Requests, Good, Errors int
	TTFTP95, TPOTP95       time.Duration // 0 without samples
}

// GoodRatio is the share of requests that met their SLO.
func (s Summary) GoodRatio() float64 { return ratio(s.Good, s.Requests) }

// ErrorRate is the share of requests that failed on the serving side (5xx, resets, timeouts).
func (s Summary) ErrorRate() float64 { return ratio(s.Errors, s.Requests) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// second is one second of one arm's requests.
type second struct {
	at                     int64 // unix second
	requests, good, errors int
	ttft, tpot             latency.Histogram
}

// armWindow is a ring of seconds.
type armWindow struct {
	ring []second
}

func (w *armWindow) slot(now int64) *second {
	s := &w.ring[int(now%int64(len(w.ring)))]
	if s.at != now {
		*s = second{at: now}
	}
	return s
}

func (w *armWindow) summary(now, from int64) Summary {
	var sum Summary
	var ttft, tpot latency.Histogram
	for i := range w.ring {
		s := &w.ring[i]
		if s.at <= now-int64(len(w.ring)) || s.at > now || s.at < from {
			continue
		}
		sum.Requests, sum.Good, sum.Errors = sum.Requests+s.requests, sum.Good+s.good, sum.Errors+s.errors
		ttft.Merge(&s.ttft)
		tpot.Merge(&s.tpot)
	}
	sum.TTFTP95, sum.TPOTP95 = ttft.Quantile(0.95), tpot.Quantile(0.95)
	return sum
}

// Windows measures every rolled-out model's arms over its rollout's window: a settle observer.
type Windows struct {
	mu       sync.Mutex
	now      func() time.Time
	windowOf func(model string) time.Duration
	models   map[string]*[2]armWindow // candidate, baseline
	counts   map[string]int           // candidate requests since the last TakeCount, per model
	from     map[string]time.Time     // requests started before are the warm-up's: not judged
}

// NewWindows keeps, for each model, the seconds of requests windowOf says (the policy's gates.window, whole
// seconds, at least one); now is the clock (time.Now when nil).
func NewWindows(windowOf func(model string) time.Duration, now func() time.Time) *Windows {
	if now == nil {
		now = time.Now
	}
	return &Windows{now: now, windowOf: windowOf, models: map[string]*[2]armWindow{}, counts: map[string]int{},
		from: map[string]time.Time{}}
}

// judgeFrom leaves a model's requests started before t out of the windows (the candidate's warm-up).
func (w *Windows) judgeFrom(model string, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.from[model] = t
}

// arms returns a model's windows, sized (again, after a policy change) to its window.
func (w *Windows) arms(model string) *[2]armWindow {
	seconds := max(1, int(w.windowOf(model)/time.Second))
	arms := w.models[model]
	if arms == nil || len(arms[0].ring) != seconds {
		arms = &[2]armWindow{{ring: make([]second, seconds)}, {ring: make([]second, seconds)}}
		w.models[model] = arms
	}
	return arms
}

// Settled implements director.SettleObserver: a routed request of a rollout arm counts, unless a tester chose
// its arm, it failed by the tenant's doing (client errors, quotas) or it went to a managed API.
func (w *Windows) Settled(st director.Settlement) {
	if !st.Routed || st.Arm == "" || st.ArmChosen || st.HardwareClass == director.ManagedClass ||
		st.Outcome == director.OutcomeClientError || st.Outcome == director.OutcomeQuota {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if from := w.from[st.Model]; !st.Started.IsZero() && st.Started.Before(from) {
		return
	}
	arms := w.arms(st.Model)
	i := 1
	if st.Arm == picker.ArmCandidate {
		i = 0
		w.counts[st.Model]++
	}
	s := arms[i].slot(w.now().Unix())
	s.requests++
	if st.Good {
		s.good++
	}
	switch st.Outcome {
	case director.OutcomeUpstream5xx, director.OutcomeReset, director.OutcomeTimeout:
		s.errors++
	}
	if st.Timing.TTFT > 0 && st.Timing.Chunked {
		s.ttft.Add(st.Timing.TTFT)
	}
	if st.Timing.TPOT > 0 {
		s.tpot.Add(st.Timing.TPOT)
	}
}

// Summaries returns a model's candidate and baseline over the window ending now.
func (w *Windows) Summaries(model string) (candidate, baseline Summary) {
	w.mu.Lock()
	defer w.mu.Unlock()
	arms := w.models[model]
	if arms == nil {
		return Summary{}, Summary{}
	}
	now, from := w.now().Unix(), w.from[model].Unix()
	if w.from[model].IsZero() {
		from = 0
	}
	return arms[0].summary(now, from), arms[1].summary(now, from)
}

// reset forgets a model's requests: a new run of its rollout judges only its own.
func (w *Windows) reset(model string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.models, model)
	delete(w.counts, model)
}

// TakeCount returns the candidate requests of a model since the last call, for a step's request count.
func (w *Windows) TakeCount(model string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.counts[model]
	w.counts[model] = 0
	return n
}
