package director

import (
	"sync"
	"time"
)

// startLatency learns, per model, how long a request takes from its placement (leaving the admission queue) to
// its first token: the engine's own queue and the prefill, and the gateway's answer to the data plane. A queued request may wait only what is left of its TTFT
// target after that, or it would start in time to miss it. The estimate is the smoothed mean plus the
// smoothed mean deviation (gains 1/8, as TCP smooths round-trip times), each observation capped at four
// times the mean: one slow request moves it little, a fleet that slows down moves it within a dozen. An
// estimate not refreshed for startLatencyFresh is forgotten: a cheaper model that requests stopped going to
// because it looked too slow for their targets (director/queue.go) gets them again, and shows whether it still is.
type startLatency struct {
	mu     sync.Mutex
	models map[string]*latencyEstimate
}

type latencyEstimate struct {
	mean, dev float64 // seconds
	at        time.Time
}

// startLatencyFresh is how long a model's start latency is believed without a new observation.
const startLatencyFresh = 10 * time.Second

func (s *startLatency) observe(model string, d time.Duration, now time.Time) {
	x := max(0, d.Seconds())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.models == nil {
		s.models = map[string]*latencyEstimate{}
	}
	e, ok := s.models[model]
	if !ok || now.Sub(e.at) > startLatencyFresh {
		s.models[model] = &latencyEstimate{mean: x, dev: x / 2, at: now}
		return
	}
	e.at = now
	x = min(x, 4*e.mean+0.01)
	diff := x - e.mean
	if diff < 0 {
		diff = -diff
	}
	e.dev += (diff - e.dev) / 8
	e.mean += (x - e.mean) / 8
}

// bound is how long a request of model is expected to take at most from leaving the queue to its first
// token (0 before any was seen, or none for startLatencyFresh).
func (s *startLatency) bound(model string, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.models[model]
	if !ok || now.Sub(e.at) > startLatencyFresh {
		return 0
	}
	return time.Duration((e.mean + e.dev) * float64(time.Second))
}
