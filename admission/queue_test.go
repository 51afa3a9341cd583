package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
	"github.com/infergate/infergate/test/wait"
)

// room is room for a number of requests, which the test frees one at a time.
type room struct {
	mu     sync.Mutex
	slots  int
	order  []string        // the names of the entries that got room, in order
	closed map[string]bool // entries that find no room whatever is free (another tier's pools, say)
	gone   map[string]bool // entries whose Try says they never will
}

func (r *room) try(name string) func() TryResult {
	return func() TryResult {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.gone[name] {
			return Gone
		}
		if r.slots == 0 || r.closed[name] {
			return NoRoom
		}
		r.slots--
		r.order = append(r.order, name)
		return Placed
	}
}

func (r *room) free(n int) { r.mu.Lock(); r.slots += n; r.mu.Unlock() }

func (r *room) started() []string { r.mu.Lock(); defer r.mu.Unlock(); return slices.Clone(r.order) }

type harness struct {
	t     *testing.T
	clock *fakeclock.Clock
	q     *Queue
	room  *room
	lim   Limits
	mu    sync.Mutex
	out   map[string]Outcome
	wg    sync.WaitGroup
}

func newHarness(t *testing.T) *harness {
	c := fakeclock.New()
	return &harness{t: t, clock: c, q: New(c, nil), room: &room{}, lim: Limits{Length: 100, Bytes: 1 << 20},
		out: map[string]Outcome{}}
}

type entry struct {
	name, tenant string
	class        policies.QueueClass
	cost, bytes  int64
	wait         time.Duration
	due          time.Duration // from now; 0: none (the wait's end)
	degradeBy    time.Duration // from now, with degrade; 0: none
	degrade      func() bool
	elsewhere    func() bool
	ctx          context.Context
}

// enqueue starts a waiter and returns once it is queued (or refused at the door).
func (h *harness) enqueue(e entry) {
	h.t.Helper()
	if e.class.Weight == 0 {
		e.class.Weight = 1
	}
	if e.class.Tier == "" {
		e.class.Tier = "t"
	}
	if e.wait == 0 {
		e.wait = time.Hour
	}
	if e.ctx == nil {
		e.ctx = context.Background()
	}
	// Queued (joined) or refused at the door (answered): a previous entry settling late must not count.
	before := h.q.Joined("m")
	now := h.clock.Now()
	var due, degradeBy time.Time
	if e.due != 0 {
		due = now.Add(max(0, e.due)) // a negative due is late at the door
	}
	if e.degradeBy != 0 {
		degradeBy = now.Add(e.degradeBy)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		out := h.q.Wait(e.ctx, &Entry{Model: "m", Tenant: e.tenant, Class: e.class, Cost: e.cost, Bytes: e.bytes,
			Deadline: now.Add(e.wait), Due: due, DegradeBy: degradeBy, Try: h.room.try(e.name), Elsewhere: e.elsewhere, Degrade: e.degrade}, h.lim)
		h.mu.Lock()
		h.out[e.name] = out
		h.mu.Unlock()
	}()
	wait.For(h.t, e.name+" queued", func() bool { return h.q.Joined("m") > before || h.answered(e.name) })
}

func (h *harness) result(name string) Result {
	h.t.Helper()
	wait.For(h.t, name+" to finish waiting", func() bool { h.mu.Lock(); defer h.mu.Unlock(); _, ok := h.out[name]; return ok })
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.out[name].Result
}

// warm gives the queue a measured drain rate: ten requests of tenant "a", each started every apart.
func (h *harness) warm(every time.Duration) {
	h.t.Helper()
	for i := range 10 {
		h.enqueue(entry{name: fmt.Sprintf("warm%d", i), tenant: "a"})
		h.clock.Advance(every)
		h.drain(1)
	}
}

// answered says whether an entry's Wait has returned.
func (h *harness) answered(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.out[name]
	return ok
}

// drain frees one slot at a time, kicking the queue, until n have started.
func (h *harness) drain(n int) []string {
	h.t.Helper()
	for range n {
		h.room.free(1)
		h.q.Kick("m")
	}
	return h.room.started()
}

func TestPriorityFairnessAndFIFO(t *testing.T) {
	enterprise := policies.QueueClass{Tier: "enterprise", Priority: 10}
	free := policies.QueueClass{Tier: "free", Priority: 0}
	tests := []struct {
		name    string
		entries []entry
		want    []string
	}{
		{"a higher priority always starts first", []entry{
			{name: "free-1", tenant: "f", class: free}, {name: "ent-1", tenant: "e", class: enterprise},
			{name: "free-2", tenant: "f", class: free}, {name: "ent-2", tenant: "e", class: enterprise},
		}, []string{"ent-1", "ent-2", "free-1", "free-2"}},
		{"one tenant's burst does not starve another of its tier", []entry{
			{name: "a1", tenant: "a", cost: 100}, {name: "a2", tenant: "a", cost: 100}, {name: "a3", tenant: "a", cost: 100},
			{name: "a4", tenant: "a", cost: 100}, {name: "b1", tenant: "b", cost: 100}, {name: "b2", tenant: "b", cost: 100},
		}, []string{"a1", "b1", "a2", "b2", "a3", "a4"}},
		{"weights share by tokens", []entry{
			{name: "heavy1", tenant: "h", cost: 100, class: policies.QueueClass{Weight: 3}},
			{name: "heavy2", tenant: "h", cost: 100, class: policies.QueueClass{Weight: 3}},
			{name: "heavy3", tenant: "h", cost: 100, class: policies.QueueClass{Weight: 3}},
			{name: "light1", tenant: "l", cost: 100}, {name: "light2", tenant: "l", cost: 100},
		}, []string{"heavy1", "heavy2", "heavy3", "light1", "light2"}},
		{"within a tenant, first come first served", []entry{
			{name: "x1", tenant: "x", cost: 500}, {name: "x2", tenant: "x", cost: 1}, {name: "x3", tenant: "x", cost: 1},
		}, []string{"x1", "x2", "x3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for _, e := range tc.entries {
				h.enqueue(e)
				h.clock.Advance(time.Millisecond)
			}
			if got := h.drain(len(tc.want)); !slices.Equal(got, tc.want) {
				t.Errorf("started %v, want %v", got, tc.want)
			}
			for _, name := range tc.want {
				if r := h.result(name); r != Started {
					t.Errorf("%s: %v", name, r)
				}
			}
			h.wg.Wait()
		})
	}
}

// A tier with a minimum share keeps it while a higher one has a backlog: strict priority otherwise.
func TestMinimumShare(t *testing.T) {
	for _, share := range []float64{0, 0.25} {
		h := newHarness(t)
		for i := range 40 {
			h.enqueue(entry{name: fmt.Sprintf("ent%d", i), tenant: "e", class: policies.QueueClass{Tier: "enterprise", Priority: 10}})
		}
		for i := range 20 {
			h.enqueue(entry{name: fmt.Sprintf("free%d", i), tenant: "f", class: policies.QueueClass{Tier: "free", MinShare: share}})
		}
		got := h.drain(40)
		free := 0
		for _, n := range got {
			if strings.HasPrefix(n, "free") {
				free++
			}
		}
		want := 0
		if share > 0 {
			want = 9 // a quarter of the forty starts, less the first few that earn the credit
		}
		if free < want || (share == 0 && free != 0) || free > 10 {
			t.Errorf("minShare %v: %d of 40 starts went to the free tier (%v), want %d to 10", share, free, got, want)
		}
		h.drain(20)
		h.wg.Wait()
	}
}

func TestDeadlineExpiresTheWait(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "short", tenant: "a", wait: 100 * time.Millisecond})
	h.enqueue(entry{name: "long", tenant: "a", wait: time.Second})
	h.clock.Advance(150 * time.Millisecond)
	if r := h.result("short"); r != Expired {
		t.Fatalf("short: %v, want expired", r)
	}
	if h.q.Len("m") != 1 {
		t.Fatalf("%d waiting, want the long one still", h.q.Len("m"))
	}
	h.drain(1)
	if r := h.result("long"); r != Started {
		t.Errorf("long: %v", r)
	}
	h.wg.Wait()
}

// Once the queue has measured its drain rate, a request that could not start before its deadline behind
// those ahead of it expires at once, and the retry-after it is given is the time the queue takes to drain.
func TestPredictedWaitExpiresAtOnce(t *testing.T) {
	h := newHarness(t)
	h.warm(100 * time.Millisecond) // 10 a second
	for i := range 5 {
		h.enqueue(entry{name: fmt.Sprintf("ahead%d", i), tenant: "a"})
	}
	h.enqueue(entry{name: "hopeless", tenant: "b", wait: 200 * time.Millisecond}) // 6 ahead at 10/s: 600 ms
	if r := h.result("hopeless"); r != Expired {
		t.Fatalf("hopeless: %v, want expired at once", r)
	}
	h.mu.Lock()
	retry := h.out["hopeless"].RetryAfter
	h.mu.Unlock()
	if retry < 400*time.Millisecond || retry > 800*time.Millisecond {
		t.Errorf("retry-after %v, want about the 600 ms the queue takes to drain", retry)
	}
	h.enqueue(entry{name: "patient", tenant: "b", wait: 2 * time.Second})
	if h.q.Len("m") != 6 {
		t.Errorf("%d waiting, want the five and the patient one", h.q.Len("m"))
	}
	h.drain(6)
	h.wg.Wait()
}

func TestFullQueueEvictsLowerPriority(t *testing.T) {
	h := newHarness(t)
	h.lim = Limits{Length: 2, Bytes: 1 << 20}
	free := policies.QueueClass{Tier: "free"}
	ent := policies.QueueClass{Tier: "enterprise", Priority: 10}
	h.enqueue(entry{name: "free1", tenant: "f", class: free})
	h.enqueue(entry{name: "free2", tenant: "f", class: free})
	h.enqueue(entry{name: "free3", tenant: "f", class: free}) // full of its own priority: refused
	if r := h.result("free3"); r != Full {
		t.Fatalf("free3: %v, want full", r)
	}
	h.enqueue(entry{name: "ent1", tenant: "e", class: ent}) // evicts the newest free one
	if r := h.result("free2"); r != Full {
		t.Fatalf("free2: %v, want evicted", r)
	}
	if got := h.drain(2); !slices.Equal(got, []string{"ent1", "free1"}) {
		t.Errorf("started %v", got)
	}
	h.wg.Wait()
}

func TestBytesBoundTheQueue(t *testing.T) {
	h := newHarness(t)
	h.lim = Limits{Length: 100, Bytes: 10_000}
	h.enqueue(entry{name: "big", tenant: "a", bytes: 8_000})
	h.enqueue(entry{name: "bigger", tenant: "a", bytes: 4_000})
	if r := h.result("bigger"); r != Full {
		t.Fatalf("bigger: %v, want full (12 kB beyond the 10 kB bound)", r)
	}
	h.enqueue(entry{name: "small", tenant: "a", bytes: 1_000})
	if h.q.Len("m") != 2 {
		t.Errorf("%d waiting", h.q.Len("m"))
	}
	h.drain(2)
	h.wg.Wait()
}

// A client that goes away while queued leaves at once and is never tried again.
func TestAbortLeavesTheQueue(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	h.enqueue(entry{name: "gone", tenant: "a", ctx: ctx})
	h.enqueue(entry{name: "stays", tenant: "a"})
	cancel()
	if r := h.result("gone"); r != Aborted {
		t.Fatalf("gone: %v", r)
	}
	if got := h.drain(1); !slices.Equal(got, []string{"stays"}) {
		t.Errorf("started %v: the aborted request must never get room", got)
	}
	h.wg.Wait()
}

func TestRetainRemovesAModelsWaiters(t *testing.T) {
	h := newHarness(t)
	h.enqueue(entry{name: "w", tenant: "a"})
	h.q.Retain(func(model string) bool { return model != "m" })
	if r := h.result("w"); r != Removed {
		t.Fatalf("w: %v, want removed", r)
	}
	h.wg.Wait()
}

// A request that arrives while the fleet has room starts at once without ever waiting.
func TestRoomAtTheDoor(t *testing.T) {
	h := newHarness(t)
	h.room.free(1)
	h.enqueue(entry{name: "lucky", tenant: "a"})
	if r := h.result("lucky"); r != Started {
		t.Fatalf("lucky: %v", r)
	}
	h.wg.Wait()
}

// Two tenants' requests of equal cost that arrive at one instant of the clock start in arrival order, whatever
// order the tenants are kept in.
func TestTiesGoByArrival(t *testing.T) {
	for range 20 {
		h := newHarness(t)
		for i := range 4 {
			h.enqueue(entry{name: fmt.Sprintf("r%d", i), tenant: fmt.Sprintf("t%d", i), cost: 10})
		}
		if got := h.drain(4); !slices.Equal(got, []string{"r0", "r1", "r2", "r3"}) {
			t.Fatalf("started %v", got)
		}
		h.wg.Wait()
	}
}

// A queue that drained once and then sat idle does not judge a newcomer by its old rate: the rate looks back
// drainWindow only, and a request with nothing ahead of it is next in line however slow the queue was.
func TestAnIdleQueueForgetsItsDrainRate(t *testing.T) {
	h := newHarness(t)
	h.warm(10 * time.Millisecond)
	h.clock.Advance(10 * time.Minute)
	h.enqueue(entry{name: "after", tenant: "a", wait: 5 * time.Second})
	h.enqueue(entry{name: "behind", tenant: "b", wait: 5 * time.Second})
	if h.q.Len("m") != 2 {
		t.Fatalf("%d waiting, want both: the old rate must not expire them at the door", h.q.Len("m"))
	}
	h.drain(2)
	for _, n := range []string{"after", "behind"} {
		if r := h.result(n); r != Started {
			t.Errorf("%s: %v", n, r)
		}
	}
	h.wg.Wait()
}

// An entry that finds no room (its tier's headroom, its pools) stops its tier for the round, not the others;
// one whose Try says it never will is answered at once instead of blocking the queue until its deadline.
func TestAHeadWithoutRoomDoesNotBlockOthers(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		closed  []string
		gone    []string
		want    []string
		results map[string]Result
	}{
		{"a higher tier without room lets a lower one start", []entry{
			{name: "gold", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}},
			{name: "tin", tenant: "t", class: policies.QueueClass{Tier: "tin"}},
		}, []string{"gold"}, nil, []string{"tin"}, nil},
		{"a minimum share's band without room does not stop the higher one", []entry{
			{name: "g1", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}},
			{name: "g2", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}},
			{name: "g3", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}},
			{name: "tin", tenant: "t", class: policies.QueueClass{Tier: "tin", MinShare: 0.5}},
		}, []string{"tin"}, nil, []string{"g1", "g2", "g3"}, nil},
		{"a tier of one priority without room lets another of that priority start", []entry{
			{name: "x", tenant: "x", class: policies.QueueClass{Tier: "narrow"}},
			{name: "y", tenant: "y", class: policies.QueueClass{Tier: "wide"}},
		}, []string{"x"}, nil, []string{"y"}, nil},
		{"an entry that never will is removed", []entry{
			{name: "orphan", tenant: "o"}, {name: "next", tenant: "n"},
		}, nil, []string{"orphan"}, []string{"next"}, map[string]Result{"orphan": Removed}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.room.closed, h.room.gone = map[string]bool{}, map[string]bool{}
			for _, n := range tc.closed {
				h.room.closed[n] = true
			}
			for _, n := range tc.gone {
				h.room.gone[n] = true
			}
			for _, e := range tc.entries {
				h.enqueue(e)
			}
			if got := h.drain(len(tc.want)); !slices.Equal(got, tc.want) {
				t.Errorf("started %v, want %v", got, tc.want)
			}
			for n, r := range tc.results {
				if got := h.result(n); got != r {
					t.Errorf("%s: %v, want %v", n, got, r)
				}
			}
			h.room.mu.Lock()
			clear(h.room.closed)
			h.room.mu.Unlock()
			h.drain(len(tc.entries))
			h.wg.Wait()
		})
	}
}

// A newcomer evicts lower-priority requests only when it will be kept: not when it would expire at the door,
// nor when its body alone is larger than the queue may hold.
func TestEvictionOnlyForAKeptNewcomer(t *testing.T) {
	h := newHarness(t)
	h.lim = Limits{Length: 1, Bytes: 1000}
	h.enqueue(entry{name: "tin", tenant: "t", class: policies.QueueClass{Tier: "tin"}, bytes: 100})
	h.enqueue(entry{name: "huge", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}, bytes: 5000})
	h.enqueue(entry{name: "late", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}, wait: -time.Second})
	if r := h.result("huge"); r != Full {
		t.Errorf("huge: %v, want full", r)
	}
	if r := h.result("late"); r != Expired {
		t.Errorf("late: %v, want expired", r)
	}
	if h.q.Len("m") != 1 {
		t.Fatalf("the tin request was evicted for newcomers that were not kept")
	}
	h.enqueue(entry{name: "gold", tenant: "g", class: policies.QueueClass{Tier: "gold", Priority: 10}, bytes: 100})
	if r := h.result("tin"); r != Full {
		t.Errorf("tin: %v, want evicted for the kept gold request", r)
	}
	h.drain(1)
	h.wg.Wait()
}

// A tenant whose request left without being served is not charged for it against the others.
func TestUnservedRequestsAreNotCharged(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	h.enqueue(entry{name: "a-gone", tenant: "a", cost: 1000, ctx: ctx})
	cancel()
	h.result("a-gone")
	h.enqueue(entry{name: "a1", tenant: "a", cost: 100})
	h.enqueue(entry{name: "b1", tenant: "b", cost: 100})
	if got := h.drain(2); !slices.Equal(got, []string{"a1", "b1"}) {
		t.Errorf("started %v: a's tag still counts the request it never got", got)
	}
	h.wg.Wait()
}

// Requests that can no longer start in time behind those ahead of them, at the rate the queue drains, leave it
// as the queue is kicked rather than waiting out their deadline; the first in line stays.
func TestHopelessWaitersLeaveEarly(t *testing.T) {
	h := newHarness(t)
	h.warm(100 * time.Millisecond) // 10 a second
	// At 10/s the sixth starts after 600 ms: all are let in.
	for i := range 6 {
		h.enqueue(entry{name: fmt.Sprintf("w%d", i), tenant: "b", wait: time.Second})
	}
	if h.q.Len("m") != 6 {
		t.Fatalf("%d waiting, want 6", h.q.Len("m"))
	}
	// Nothing starts for 600 ms: the rate falls to 10 starts in 1.5 s (6.7/s), and with 400 ms left the second
	// in line can still start (300 ms), the third cannot (450 ms).
	h.clock.Advance(600 * time.Millisecond)
	h.q.Kick("m")
	for i, want := range []Result{0, 0, Expired, Expired, Expired, Expired} {
		name := fmt.Sprintf("w%d", i)
		if want == 0 {
			continue
		}
		if r := h.result(name); r != want {
			t.Errorf("%s: %v, want %v", name, r, want)
		}
	}
	if h.q.Len("m") != 2 {
		t.Errorf("%d waiting, want the first two", h.q.Len("m"))
	}
	h.drain(2)
	h.wg.Wait()
}
