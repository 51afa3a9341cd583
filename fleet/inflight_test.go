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
