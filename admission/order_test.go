package admission

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
)

var (
	enterprise = policies.QueueClass{Tier: "enterprise", Priority: 20, Weight: 1}
	pro        = policies.QueueClass{Tier: "pro", Priority: 10, Weight: 1}
	free       = policies.QueueClass{Tier: "free", Weight: 1}
)

// A request whose time runs short while lower tiers wait keeps its place: the newest request of the lowest
// tier yields its place instead, and the late one starts first at the next room.
func TestLateRequestKeepsItsPlaceOverLowerTiers(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "free2", tenant: "f", class: free})
	h.enqueue(entry{name: "pro1", tenant: "p", class: pro})
	h.enqueue(entry{name: "ent", tenant: "e", class: enterprise, due: 100 * time.Millisecond, wait: 10 * time.Second})
	h.clock.Advance(150 * time.Millisecond)
	if r := h.result("free2"); r != Yielded {
		t.Fatalf("free2: %v, want it to yield its place", r)
	}
	if h.answered("ent") || h.answered("free1") || h.answered("pro1") {
		t.Fatal("only the newest of the lowest tier should have left")
	}
	// Late, it waits on to its hard deadline without costing anyone else a place.
	h.clock.Advance(time.Second)
	if h.q.Len("m") != 3 {
		t.Fatalf("%d waiting, want ent, pro1 and free1", h.q.Len("m"))
	}
	if got := h.drain(3); !slices.Equal(got, []string{"ent", "pro1", "free1"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// A late request waits behind the requests of its tier that can still be on time (it has missed its target
// already; starting it first would make them miss theirs too), and ahead of every lower tier.
func TestLateRequestsGoAfterTheirTiersTimelyOnes(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "free2", tenant: "f", class: free})
	h.enqueue(entry{name: "late", tenant: "e", class: enterprise, due: -1})
	if r := h.result("free2"); r != Yielded {
		t.Fatalf("free2: %v, want yielded", r)
	}
	h.enqueue(entry{name: "timely", tenant: "e2", class: enterprise, due: time.Second})
	h.enqueue(entry{name: "pro", tenant: "p", class: pro})
	if got := h.drain(4); !slices.Equal(got, []string{"timely", "late", "pro", "free1"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// With no lower tier waiting, a late request expires at its due time: its place goes to its own tier's
// requests that can still be on time.
func TestLateRequestExpiresWithNothingBelowIt(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "ent1", tenant: "e", class: enterprise, due: 100 * time.Millisecond, wait: 10 * time.Second})
	h.enqueue(entry{name: "ent2", tenant: "e", class: enterprise, due: 500 * time.Millisecond, wait: 10 * time.Second})
	h.enqueue(entry{name: "pro1", tenant: "p", class: pro, wait: 10 * time.Second})
	h.clock.Advance(150 * time.Millisecond)
	if r := h.result("pro1"); r != Yielded {
		t.Fatalf("pro1: %v, want it to yield to ent1", r)
	}
	h.clock.Advance(400 * time.Millisecond) // ent2 due, nothing below it: ent2 expires, ent1 stays late
	if r := h.result("ent2"); r != Expired {
		t.Fatalf("ent2: %v, want expired", r)
	}
	if got := h.drain(1); !slices.Equal(got, []string{"ent1"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// At the door: a request that is late already (its start latency eats its whole target) joins when a lower
// tier waits, which yields, and is refused as expired when none does.
func TestLateAtTheDoor(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "ent0", tenant: "e", class: enterprise, due: -1})
	if r := h.result("ent0"); r != Expired {
		t.Fatalf("ent0: %v, want expired with nothing below it", r)
	}
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "ent1", tenant: "e", class: enterprise, due: -1})
	if r := h.result("free1"); r != Yielded {
		t.Fatalf("free1: %v, want yielded", r)
	}
	if h.answered("ent1") {
		t.Fatal("ent1 was refused though free1 waited below it")
	}
	// A request of the same tier is no reason to yield.
	h.enqueue(entry{name: "ent2", tenant: "e2", class: enterprise, due: -1})
	if r := h.result("ent2"); r != Expired {
		t.Fatalf("ent2: %v, want expired", r)
	}
	if got := h.drain(1); !slices.Equal(got, []string{"ent1"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// A late request that can go elsewhere (a cheaper model, a managed API) goes, at its due time or at the door,
// and nobody yields to it; one whose Elsewhere finds nothing is kept as any other.
func TestLateRequestGoesElsewhereFirst(t *testing.T) {
	h := newHarness(t)
	yes := func() bool { return true }
	no := func() bool { return false }
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "ent1", tenant: "e", class: enterprise, due: 100 * time.Millisecond, elsewhere: yes})
	h.enqueue(entry{name: "ent2", tenant: "e", class: enterprise, due: -1, elsewhere: yes})
	if r := h.result("ent2"); r != Degraded {
		t.Fatalf("ent2: %v, want degraded at the door", r)
	}
	h.clock.Advance(100 * time.Millisecond)
	if r := h.result("ent1"); r != Degraded {
		t.Fatalf("ent1: %v, want degraded at its due time", r)
	}
	if h.answered("free1") {
		t.Fatal("free1 yielded to a request that could go elsewhere")
	}
	h.enqueue(entry{name: "ent3", tenant: "e", class: enterprise, due: -1, elsewhere: no})
	if r := h.result("free1"); r != Yielded {
		t.Fatalf("free1: %v, want it to yield to ent3, which has nowhere else to go", r)
	}
	h.drain(1)
	if r := h.result("ent3"); r != Started {
		t.Errorf("ent3: %v", r)
	}
	h.wg.Wait()
}

// A request whose cheaper model takes longer to a first token than its own goes there while it can still be on
// time there, if there is room; without room it waits on for its own model, and at its due time is late as any
// other.
func TestDegradeByGoesWhileTheCheaperModelIsInTime(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	room := true
	degrade := func() bool { mu.Lock(); defer mu.Unlock(); return room }
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "went", tenant: "e", class: enterprise, due: time.Second, degradeBy: 600 * time.Millisecond, degrade: degrade})
	h.clock.Advance(599 * time.Millisecond)
	if h.answered("went") {
		t.Fatal("went left before its DegradeBy")
	}
	h.clock.Advance(time.Millisecond)
	if r := h.result("went"); r != Degraded {
		t.Fatalf("went: %v, want degraded at its DegradeBy", r)
	}

	mu.Lock()
	room = false
	mu.Unlock()
	h.enqueue(entry{name: "stayed", tenant: "e", class: enterprise, due: time.Second, degradeBy: 600 * time.Millisecond, degrade: degrade})
	h.clock.Advance(600 * time.Millisecond)
	if h.answered("stayed") || h.answered("free1") {
		t.Fatal("with no room on the cheaper model, stayed waits on for its own and nobody yields yet")
	}
	h.clock.Advance(400 * time.Millisecond) // its due time, with nowhere else to go: free1 yields
	if r := h.result("free1"); r != Yielded {
		t.Fatalf("free1: %v, want it to yield to the late request", r)
	}
	if got := h.drain(1); !slices.Equal(got, []string{"stayed"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// The sweep that sheds requests that cannot start in time treats a request that would start late the same
// way: a lower one yields for it.
func TestSweepYieldsForLateRequests(t *testing.T) {
	h := newHarness(t)
	h.warm(100 * time.Millisecond) // 10 a second
	for i := range 3 {
		h.enqueue(entry{name: fmt.Sprintf("free%d", i), tenant: "f", class: free, wait: time.Minute})
	}
	for i := range 3 {
		h.enqueue(entry{name: fmt.Sprintf("ent%d", i), tenant: "e", class: enterprise, due: time.Second, wait: time.Minute})
	}
	// Nothing starts for 900 ms: at about 6.9 starts a second the second and third enterprise requests in line
	// start after their due time. The two newest free requests yield to them.
	h.clock.Advance(900 * time.Millisecond)
	h.q.Kick("m")
	for _, name := range []string{"free2", "free1"} {
		if r := h.result(name); r != Yielded {
			t.Errorf("%s: %v, want yielded", name, r)
		}
	}
	if h.q.Len("m") != 4 {
		t.Errorf("%d waiting, want the three enterprise requests and free0", h.q.Len("m"))
	}
	if got := h.drain(4)[10:]; !slices.Equal(got, []string{"ent0", "ent1", "ent2", "free0"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

// The invariant, over random arrivals, due times and room: whenever a request leaves the queue for want of
// time (expired in the queue or refused at the door), no request of lower priority waits for its model. The
// hard deadlines are an hour away, beyond the test's span, so every expiry here is one for lateness.
func TestTierOrderInvariant(t *testing.T) {
	for seed := range uint64(30) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkTierOrder(t, seed) })
	}
}

func checkTierOrder(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	clock := fakeclock.New()
	q := New(clock, nil)
	var violations []string
	ends := map[Result]int{}
	q.onEnd = func(mq *modelQueue, e *Entry, r Result) { // under the queue's lock
		ends[r]++
		if r != Expired {
			return
		}
		for _, b := range mq.bands {
			if b.priority < e.Class.Priority && b.count > 0 {
				violations = append(violations, fmt.Sprintf("%s expired with %d of priority %d waiting", e.Class.Tier, b.count, b.priority))
			}
		}
	}
	classes := []policies.QueueClass{enterprise, pro, free}
	var mu sync.Mutex
	slots := 0
	try := func() TryResult {
		mu.Lock()
		defer mu.Unlock()
		if slots == 0 {
			return NoRoom
		}
		slots--
		return Placed
	}
	var wg sync.WaitGroup
	answered := 0
	for range 400 {
		switch x := rng.IntN(10); {
		case x < 6: // an arrival, late already or due within 600 ms
			now := clock.Now()
			e := &Entry{Model: "m", Tenant: fmt.Sprint(rng.IntN(3)), Class: classes[rng.IntN(len(classes))], Cost: 1,
				Try: try, Deadline: now.Add(time.Hour), Due: now.Add(time.Duration(rng.IntN(800)-200) * time.Millisecond)}
			joined := q.Joined("m")
			done := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(done)
				q.Wait(context.Background(), e, Limits{Length: 40, Bytes: 1 << 20})
			}()
			waitJoined(q, joined, done)
		case x < 8: // room for one
			mu.Lock()
			slots++
			mu.Unlock()
			q.Kick("m")
		default:
			clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
	}
	mu.Lock()
	slots = 1 << 20
	mu.Unlock()
	q.Kick("m")
	wg.Wait() // every request ended: started, expired, yielded or full
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, n := range ends {
		answered += n
	}
	if answered == 0 {
		t.Fatal("no request ended")
	}
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %s (ends %v)", len(violations), violations[0], ends)
	}
	if ends[Yielded] == 0 || ends[Expired] == 0 || ends[Started] == 0 {
		t.Errorf("ends %v: the run should see starts, yields and expiries", ends)
	}
}

// waitJoined waits until a request joined the queue or its Wait returned.
func waitJoined(q *Queue, before uint64, done <-chan struct{}) {
	for q.Joined("m") == before {
		select {
		case <-done:
			return
		default:
			runtime.Gosched() // the waiter is this test's goroutine, not yet at the queue
		}
	}
}
