package fleetsim

import (
	"testing"
	"time"
)

// drive runs a VirtualEngine's steps from at until it idles, as a discrete-event loop does, and returns when it
// idled, what had its first token and what retired, in order.
func drive(t *testing.T, v *VirtualEngine, at time.Time) (idle time.Time, firstTokens, retired []*Sequence) {
	for {
		d, busy := v.Step(at)
		if !busy {
			return at, firstTokens, retired
		}
		at = at.Add(d)
		first, done := v.Finish(at)
		for _, q := range first {
			if !q.FirstToken().Equal(at) {
				t.Errorf("first token at %v reported at the end of the step at %v", q.FirstToken(), at)
			}
		}
		firstTokens, retired = append(firstTokens, first...), append(retired, done...)
	}
}

// A VirtualEngine is the HTTP replica's engine in the caller's time: the same step arithmetic, with first
// tokens, finishes and the prefix cache stamped on the simulated clock.
func TestVirtualEngineRunsOnTheCallersClock(t *testing.T) {
	v := NewVirtualEngine(EngineConfig{Hardware: honestHardware, BlockSize: 16, NumGPUBlocks: 1000, MaxNumBatchedTokens: 2048})
	t0 := time.Unix(1000, 0)
	first, err := v.Submit(t0, promptOf("a", 1000), 3)
	if err != nil {
		t.Fatal(err)
	}
	idle, firstTokens, retired := drive(t, v, t0)
	if len(firstTokens) != 1 || firstTokens[0] != first {
		t.Errorf("first tokens reported for %v, want the submitted handle once", firstTokens)
	}
	// Prefill 2 + 100 ms (first token), then two decode steps of 2 + 20 + 1 ms each.
	if got, want := first.FirstToken().Sub(t0), ms(102); (got - want).Abs() > time.Microsecond {
		t.Errorf("first token after %v, want %v", got, want)
	}
	if got, want := first.Finished().Sub(t0), ms(102+2*23); (got-want).Abs() > time.Microsecond || !idle.Equal(first.Finished()) {
		t.Errorf("finished after %v (idle at %v), want %v", got, idle.Sub(t0), want)
	}
	if len(retired) != 1 || retired[0] != first || first.Output() != 3 || first.Prompt() != 1000 {
		t.Fatalf("retired %v, output %d: want the submitted handle with 3 tokens", retired, first.Output())
	}
	// The same prompt again, a minute later: 992 tokens (62 full blocks) come from the cache.
	t1 := idle.Add(time.Minute)
	again, err := v.Submit(t1, promptOf("a", 1000), 1)
	if err != nil {
		t.Fatal(err)
	}
	drive(t, v, t1)
	if again.Cached() != 992 || (again.FirstToken().Sub(t1)-ms(2+0.8)).Abs() > time.Microsecond {
		t.Errorf("cached %d, first token after %v: want 992 cached and 2.8 ms", again.Cached(), again.FirstToken().Sub(t1))
	}
	if busy := v.BusyTime(); (busy - ms(102+46+2.8)).Abs() > 3*time.Microsecond {
		t.Errorf("busy %v, want the steps' sum 150.8 ms", busy)
	}
	if running, waiting, _ := v.Load(); running != 0 || waiting != 0 {
		t.Errorf("running %d, waiting %d after both finished", running, waiting)
	}
	if _, err := v.Submit(t1, promptOf("b", 20000), 1); err == nil {
		t.Error("a prompt longer than the whole KV cache was accepted")
	}
}
