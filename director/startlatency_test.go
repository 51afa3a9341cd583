package director

import (
	"testing"
	"time"
)

// The start latency bound is the smoothed mean plus deviation, and is forgotten once no request has refreshed
// it for startLatencyFresh: a model requests stopped going to gets them again.
func TestStartLatencyBoundAndFreshness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s startLatency
	s.observe("m", 400*time.Millisecond, t0)
	tests := []struct {
		name string
		at   time.Time
		want time.Duration
	}{
		{"one observation: the mean and half of it", t0, 600 * time.Millisecond},
		{"still believed", t0.Add(startLatencyFresh), 600 * time.Millisecond},
		{"forgotten", t0.Add(startLatencyFresh + time.Millisecond), 0},
	}
	for _, tc := range tests {
		if got := s.bound("m", tc.at); got != tc.want {
			t.Errorf("%s: bound %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := s.bound("other", t0); got != 0 {
		t.Errorf("a model never seen: bound %v, want 0", got)
	}
	// A new observation after it was forgotten starts afresh rather than smoothing into the old estimate.
	late := t0.Add(2 * startLatencyFresh)
	s.observe("m", 100*time.Millisecond, late)
	if got := s.bound("m", late); got != 150*time.Millisecond {
		t.Errorf("after a fresh start: bound %v, want 150ms", got)
	}
}
