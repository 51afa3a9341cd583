package fleet

import (
	"sync"
	"testing"
)

func TestInFlightConcurrent(t *testing.T) {
	var f InFlight
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep := []string{"a:1", "b:1"}[i%2]
			for range 1000 {
				f.Start(ep)
				f.Done(ep)
			}
			f.Start(ep)
		}()
	}
	wg.Wait()
	if f.Count("a:1") != 32 || f.Count("b:1") != 32 || f.Total() != 64 || f.Count("c:1") != 0 {
		t.Fatalf("counts a=%d b=%d total=%d", f.Count("a:1"), f.Count("b:1"), f.Total())
	}
}

func TestInFlightLastStarted(t *testing.T) {
	var f InFlight
	if f.LastStarted("a:1") != 0 {
		t.Fatal("never-used endpoint has a start")
	}
	f.Start("a:1")
	f.Start("b:1")
	f.Done("a:1")
	if !(f.LastStarted("a:1") < f.LastStarted("b:1")) || f.LastStarted("a:1") == 0 {
		t.Errorf("a started at %d, b at %d", f.LastStarted("a:1"), f.LastStarted("b:1"))
	}
	f.Start("a:1")
	if !(f.LastStarted("a:1") > f.LastStarted("b:1")) {
		t.Errorf("a restarted at %d, b at %d", f.LastStarted("a:1"), f.LastStarted("b:1"))
	}
}

// Hold counts by tier beside Start, per endpoint, and Release undoes it.
func TestInFlightHeld(t *testing.T) {
	var f InFlight
	if f.Held("a:1", "gold") != 0 {
		t.Fatal("an endpoint never seen holds requests")
	}
	f.Hold("a:1", "gold")
	f.Hold("a:1", "gold")
	f.Hold("a:1", "silver")
	f.Hold("b:1", "gold")
	f.Release("a:1", "gold")
	for _, c := range []struct {
		ep, tier string
		want     int64
	}{{"a:1", "gold", 1}, {"a:1", "silver", 1}, {"b:1", "gold", 1}, {"b:1", "silver", 0}, {"c:1", "gold", 0}} {
		if got := f.Held(c.ep, c.tier); got != c.want {
			t.Errorf("%s holds %d of %s, want %d", c.ep, got, c.tier, c.want)
		}
	}
}
