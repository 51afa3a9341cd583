// Package admission holds the requests that no endpoint has room for, between quota admission and placement:
// a bounded queue per model, in priority order between tiers, fair between the tenants of a tier, first come
// first served within a tenant, each request bounded by a deadline after which the director degrades or sheds
// it. The queue knows nothing of endpoints: an entry's Try says whether it found room, and whoever frees room
// (a request settling, a fresh scrape of engine metrics) kicks the queue to try again.
//
// Tier order is an invariant, not a tuning: a request is never shed for want of time while a request of lower
// priority waits for the same model. When a request's time runs short (it could no longer start in time for its
// target), it goes elsewhere if it can (Elsewhere: a cheaper model, a managed API); if not, the newest request
// of the lowest priority below it gives up its place instead (Yielded), and the late request keeps its own
// until it starts or reaches its hard deadline. Only when nothing lower waits is a late request shed, so that
// its place goes to requests of its own priority that can still be on time. A gateway starved of CPU, whose
// requests all look late, therefore sheds from the bottom up.
package admission

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/infergate/infergate/policies"
)

// Result is how a request's wait ended.
type Result int

// The ways a wait ends.
const (
	Started  Result = iota + 1 // Try found room: the request is routed
	Expired                    // its deadline came, or it could not have started by it
	Full                       // the queue was full (or the entry was evicted for a higher priority)
	Aborted                    // the client went away
	Removed                    // a policy reload removed its model
	Yielded                    // it gave up its place to a higher-priority request that was short of time
	Degraded                   // short of time, it went elsewhere (Entry.Elsewhere)
)

var resultNames = map[Result]string{Started: "started", Expired: "expired", Full: "full", Aborted: "aborted",
	Removed: "removed", Yielded: "yielded", Degraded: "degraded"}

func (r Result) String() string { return resultNames[r] }

// Entry is one request waiting for room.
type Entry struct {
	Model  string // canonical model name: the queue it waits in
	Tenant string // the fairness key within its priority
	Class  policies.QueueClass
	// Cost is what the request counts for against its tier's other tenants (its estimated tokens).
	Cost int64
	// Bytes is the body the gateway holds while it waits.
	Bytes int64
	// Deadline is the hard end of the wait: the longest the tenant's policy or the client lets it wait.
	Deadline time.Time
	// Due is when starting later makes the request late for its target (zero: Deadline). A request past it
	// still waits while any lower-priority request of its model waits (the lowest of them yields its place);
	// with none, it is shed.
	Due time.Time
	// DegradeBy, when set before Due, is when starting on a cheaper model later makes the request late there
	// (it takes longer to a first token than the request's own model): one not started by then calls Degrade,
	// and waits on for its own model when that finds no room.
	DegradeBy time.Time
	// Try places the request if some endpoint has room now, and says whether it did (Placed), could not yet
	// (NoRoom) or never will (Gone: what it was allowed to use is no longer there). The queue calls it with its
	// lock held, one entry at a time in queue order, so it must be quick and must not call the queue.
	Try func() TryResult
	// Elsewhere, when set, places the request somewhere other than its model's own endpoints (a cheaper
	// model, a managed API) and says whether it did: called, like Try, with the queue's lock held, when the
	// request's time runs short and before anyone yields to it, since a request that can go elsewhere in time
	// need not take a lower tier's place.
	Elsewhere func() bool
	// Degrade places the request on that cheaper model alone and says whether it did; called at DegradeBy,
	// as Try is.
	Degrade func() bool

	result   Result
	done     chan struct{}
	enqueued time.Time
	seq      uint64  // arrival order in its queue (a clock may give two arrivals one instant)
	start    float64 // fair-queuing tags, in the band's virtual time
	finish   float64
	stop     func() bool
	band     *band
	started  bool
	late     bool // past Due, kept because a lower-priority request yielded its place
	// pastDegradeBy: its DegradeBy came and found no room; its timer is set to its Due.
	pastDegradeBy bool
}

// due is when e becomes late: Due, or its Deadline when it has none or a later one.
func (e *Entry) due() time.Time {
	if e.Due.IsZero() || e.Due.After(e.Deadline) {
		return e.Deadline
	}
	return e.Due
}

// degradeBy is e's DegradeBy when it has one before its due time and a Degrade to call; zero otherwise.
func (e *Entry) degradeBy() time.Time {
	if e.Degrade == nil || e.DegradeBy.IsZero() || !e.DegradeBy.Before(e.due()) {
		return time.Time{}
	}
	return e.DegradeBy
}

// TryResult is what an entry's Try found.
type TryResult int

// What Try finds.
const (
	NoRoom TryResult = iota
	Placed
	Gone
)

// Outcome is what Wait reports.
type Outcome struct {
	Result Result
	Waited time.Duration
	// RetryAfter is when a shed client should try again: how long the queue takes to drain at the rate it
	// was measured to drain.
	RetryAfter time.Duration
}

// Limits bound one model's queue.
type Limits struct {
	Length int
	Bytes  int64
}

// Clock is the queue's time; tests drive a fake one.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d, unless the returned stop is called first (it reports whether it stopped f).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// Queue is safe for concurrent use.
type Queue struct {
	clock   Clock
	metrics *Metrics
	// onEnd, when set, sees every wait end (and every refusal at the door) under the queue's lock: the tests
	// check the queue's invariants with it.
	onEnd func(mq *modelQueue, e *Entry, r Result)

	mu     sync.Mutex
	models map[string]*modelQueue
}

// New builds a queue on the system clock (nil clock) and records to m (nil: unregistered series).
func New(clock Clock, m *Metrics) *Queue {
	if clock == nil {
		clock = systemClock{}
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &Queue{clock: clock, metrics: m, models: map[string]*modelQueue{}}
}

// Metrics returns the queue's series, for the director to count what became of expired requests.
func (q *Queue) Metrics() *Metrics { return q.metrics }

// Wait holds e until it starts, expires, is evicted, its model is removed or ctx ends (the client went away),
// whichever comes first. An entry that cannot start before its deadline at the queue's measured drain rate
// expires at once rather than waiting for nothing.
func (q *Queue) Wait(ctx context.Context, e *Entry, lim Limits) Outcome {
	now := q.clock.Now()
	e.done, e.enqueued = make(chan struct{}), now
	q.mu.Lock()
	mq := q.model(e.Model)
	if out, ok := q.refuse(mq, e, lim, now); !ok {
		if q.onEnd != nil {
			q.onEnd(mq, e, out.Result)
		}
		q.mu.Unlock()
		q.metrics.finished(e, out.Result, 0)
		return out
	}
	mq.push(e)
	q.metrics.enqueued(e)
	mq.dispatch(q, now) // room may have come since the caller looked
	if e.result == 0 {
		q.arm(e, now)
	}
	q.mu.Unlock()

	select {
	case <-e.done:
	case <-ctx.Done():
		q.mu.Lock()
		if e.result == 0 {
			q.finish(mq, e, Aborted)
		}
		q.mu.Unlock()
		<-e.done
	}
	out := Outcome{Result: e.result, Waited: q.clock.Now().Sub(e.enqueued)}
	if e.result == Expired || e.result == Full || e.result == Yielded {
		q.mu.Lock()
		out.RetryAfter = mq.retryAfter(q.clock.Now())
		q.mu.Unlock()
	}
	return out
}

// refuse decides, before e joins the queue, whether it cannot: the queue is full of requests of its priority
// or higher (a lower one is evicted to make room), or at the drain rate it could not start before its hard
// deadline, or it is late already (or would be) and no request of lower priority waits to yield it its place.
func (q *Queue) refuse(mq *modelQueue, e *Entry, lim Limits, now time.Time) (Outcome, bool) {
	expired := Outcome{Result: Expired, RetryAfter: mq.retryAfter(now)}
	if !e.Deadline.After(now) {
		return expired, false
	}
	wait, known := mq.predictedWait(e.Class.Priority, now)
	if known && now.Add(wait).After(e.Deadline) {
		return expired, false
	}
	full := func() bool { return mq.length+1 > lim.Length || mq.bytes+e.Bytes > lim.Bytes }
	if e.Bytes > lim.Bytes || (full() && !mq.canEvictFor(e, lim)) {
		return Outcome{Result: Full, RetryAfter: mq.retryAfter(now)}, false
	}
	if late := !e.due().After(now) || (known && now.Add(wait).After(e.due())); late {
		if e.Elsewhere != nil && e.Elsewhere() {
			return Outcome{Result: Degraded}, false
		}
		v := mq.yielder(e.Class.Priority, nil)
		if v == nil {
			return expired, false
		}
		q.finish(mq, v, Yielded)
		e.late = true
	}
	for full() { // the lower-priority requests evicted for e are enough to take it: canEvictFor said so
		q.finish(mq, mq.lowest(), Full)
	}
	return Outcome{}, true
}

// arm sets e's timer: to its DegradeBy, its Due, or to its Deadline once it is late or has no earlier Due.
func (q *Queue) arm(e *Entry, now time.Time) {
	if by := e.degradeBy(); !e.late && !e.pastDegradeBy && !by.IsZero() {
		e.stop = q.clock.AfterFunc(by.Sub(now), func() { q.degradeNow(e) })
		return
	}
	if !e.late && e.due().Before(e.Deadline) {
		e.stop = q.clock.AfterFunc(e.due().Sub(now), func() { q.lateNow(e) })
		return
	}
	e.stop = q.clock.AfterFunc(e.Deadline.Sub(now), func() { q.expire(e) })
}

// degradeNow is e's DegradeBy come while it waits: it goes to the cheaper model if that has room, and waits on
// for its own model to its Due otherwise.
func (q *Queue) degradeNow(e *Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.result != 0 {
		return
	}
	if e.Degrade() {
		q.finish(q.models[e.Model], e, Degraded)
		return
	}
	e.pastDegradeBy = true
	q.arm(e, q.clock.Now())
}

// lateNow is e's Due come while it waits: it goes elsewhere if it can, or the lowest request below it yields
// its place and e waits on to its Deadline, or, with none below it, e expires.
func (q *Queue) lateNow(e *Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.result != 0 {
		return
	}
	mq := q.models[e.Model]
	if e.Elsewhere != nil && e.Elsewhere() {
		q.finish(mq, e, Degraded)
		return
	}
	v := mq.yielder(e.Class.Priority, nil)
	if v == nil {
		q.finish(mq, e, Expired)
		return
	}
	q.finish(mq, v, Yielded)
	mq.becomeLate(e)
	q.arm(e, q.clock.Now())
}

func (q *Queue) model(name string) *modelQueue {
	mq, ok := q.models[name]
	if !ok {
		mq = &modelQueue{}
		q.models[name] = mq
	}
	return mq
}

// finish ends e's wait with r: it leaves the queue and its waiter wakes.
func (q *Queue) finish(mq *modelQueue, e *Entry, r Result) {
	mq.remove(e)
	if q.onEnd != nil {
		q.onEnd(mq, e, r)
	}
	e.result = r
	if e.stop != nil {
		e.stop()
	}
	q.metrics.finished(e, r, q.clock.Now().Sub(e.enqueued))
	close(e.done)
}

func (q *Queue) expire(e *Entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.result == 0 {
		q.finish(q.models[e.Model], e, Expired)
	}
}

// Kick tries to start the waiting requests of a model, in queue order, until one finds no room: call it when
// a request to the model ended (its endpoint has room again).
func (q *Queue) Kick(model string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if mq, ok := q.models[model]; ok {
		mq.dispatch(q, q.clock.Now())
	}
}

// KickAll kicks every model: call it when fresh engine metrics arrived.
func (q *Queue) KickAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	for _, mq := range q.models {
		mq.dispatch(q, now)
	}
}

// Retain ends the wait of every request whose model keep refuses (a reload removed it), with Removed.
func (q *Queue) Retain(keep func(model string) bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for name, mq := range q.models {
		if keep(name) {
			continue
		}
		for e := mq.lowest(); e != nil; e = mq.lowest() {
			q.finish(mq, e, Removed)
		}
	}
}

// Len is how many requests wait for model.
func (q *Queue) Len(model string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if mq, ok := q.models[model]; ok {
		return mq.length
	}
	return 0
}

// Joined is how many requests have joined model's queue since it was built (those refused at the door are
// not counted): a test watches a request start waiting with it.
func (q *Queue) Joined(model string) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if mq, ok := q.models[model]; ok {
		return mq.joined
	}
	return 0
}

// modelQueue is one model's waiting requests: a band per priority, highest first.
type modelQueue struct {
	bands  []*band // by priority, highest first
	length int
	bytes  int64
	joined uint64
	drain  drainRate
	swept  time.Time // the last shedHopeless
}

func (mq *modelQueue) push(e *Entry) {
	e.seq = mq.joined + 1
	b := mq.band(e.Class.Priority, e.late)
	if !e.late {
		b.minShare = max(b.minShare, e.Class.MinShare)
	}
	b.push(e)
	e.band = b
	mq.length++
	mq.bytes += e.Bytes
	mq.joined++
}

// band is priority's band of requests on time, or of late ones: bands go by priority, highest first, and a
// priority's late requests after its requests that can still be on time (they have missed their target
// already; starting them first would make the others miss it too), but before any lower priority.
func (mq *modelQueue) band(priority int, late bool) *band {
	i, found := slices.BinarySearchFunc(mq.bands, priority, func(b *band, p int) int {
		return cmp.Or(cmp.Compare(p, b.priority), cmp.Compare(lateRank(b.late), lateRank(late)))
	})
	if !found {
		mq.bands = slices.Insert(mq.bands, i, &band{priority: priority, late: late, tenants: map[string]*tenantQueue{}})
	}
	return mq.bands[i]
}

func lateRank(late bool) int {
	if late {
		return 1
	}
	return 0
}

// becomeLate moves a waiting e to its priority's late band, keeping its arrival order.
func (mq *modelQueue) becomeLate(e *Entry) {
	if e.late || e.band == nil || !e.band.remove(e) {
		return
	}
	e.late = true
	b := mq.band(e.Class.Priority, true)
	b.push(e)
	e.band = b
}

func (mq *modelQueue) remove(e *Entry) {
	if e.band == nil || !e.band.remove(e) {
		return
	}
	mq.length--
	mq.bytes -= e.Bytes
}

// dispatch starts entries while some find room, in queue order: the band owed its minimum share first, then
// the bands by priority; within a band, tenants by their fair-queuing tags. An entry that finds no room stops
// the others of its tier for this round (they would find none either) but not the other tiers, whose room may
// differ (headroom, hardware classes); one whose Try says it never will is answered at once.
func (mq *modelQueue) dispatch(q *Queue, now time.Time) {
	for mq.startOne(q, now) {
	}
	mq.shedHopeless(q, now)
}

// sweepEvery is how often a model's queue looks for requests that can no longer start in time.
const sweepEvery = 100 * time.Millisecond

// shedHopeless expires, at most every sweepEvery, the waiting requests that could not start before their
// deadline behind those ahead of them in queue order at the measured drain rate — a lower bound of their wait,
// since later arrivals of higher priority may still pass them. They would only wait out their deadline and
// keep the requests behind them of their tenant waiting too (after an overload, the queue drains that much
// sooner). One that would start after its Due but before its Deadline is late: as at its Due, it goes
// elsewhere, or the lowest request below it yields its place, or it expires when none is below it. The first
// in line is always kept.
func (mq *modelQueue) shedHopeless(q *Queue, now time.Time) {
	if mq.length < 2 || now.Sub(mq.swept) < sweepEvery {
		return
	}
	mq.swept = now
	rate, ok := mq.drain.perSecond(now)
	if !ok {
		return
	}
	ends := map[*Entry]Result{}
	var late []*Entry
	ahead := 0
	for _, b := range mq.bands {
		for _, e := range b.inOrder() {
			if _, ending := ends[e]; ending {
				continue
			}
			at := now.Add(time.Duration(float64(ahead+1) / rate * float64(time.Second)))
			switch {
			case ahead == 0:
			case at.After(e.Deadline):
				ends[e] = Expired
				continue
			case !e.late && at.After(e.due()):
				if e.Elsewhere != nil && e.Elsewhere() {
					ends[e] = Degraded
					continue
				}
				v := mq.yielder(e.Class.Priority, ends)
				if v == nil {
					ends[e] = Expired
					continue
				}
				ends[v] = Yielded
				late = append(late, e)
			}
			ahead++
		}
	}
	// The lowest first: a late request with none below it left to yield ends after those below it.
	order := slices.SortedFunc(maps.Keys(ends), func(x, y *Entry) int {
		return cmp.Or(cmp.Compare(x.Class.Priority, y.Class.Priority), cmp.Compare(x.seq, y.seq))
	})
	for _, e := range order {
		q.finish(mq, e, ends[e])
	}
	for _, e := range late {
		mq.becomeLate(e)
		e.stop()
		q.arm(e, now) // to its Deadline now
	}
}

// startOne starts the first entry in queue order that finds room, reporting whether one did.
func (mq *modelQueue) startOne(q *Queue, now time.Time) bool {
	var blocked map[string]bool // tiers that found no room this round
	for _, b := range mq.order() {
		for _, e := range b.heads() {
			if blocked[e.Class.Tier] {
				continue
			}
			switch e.Try() {
			case Placed:
				mq.started(b, e, now)
				q.finish(mq, e, Started)
				return true
			case Gone:
				q.finish(mq, e, Removed)
				return true
			}
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[e.Class.Tier] = true
		}
	}
	return false
}

// order is the bands to try: one owed its minimum share (the lowest such) first, then all by priority.
func (mq *modelQueue) order() []*band {
	for i := len(mq.bands) - 1; i >= 0; i-- {
		if b := mq.bands[i]; b.count > 0 && b.credit >= 1 {
			return append([]*band{b}, mq.bands...)
		}
	}
	return mq.bands
}

// started accounts for e's start: its band's virtual time and share credit, the drain rate.
func (mq *modelQueue) started(b *band, e *Entry, now time.Time) {
	if b.credit >= 1 {
		b.credit--
	}
	b.vclock = max(b.vclock, e.start)
	e.started = true
	mq.drain.record(now)
	for _, w := range mq.bands { // every start earns each waiting band its share of one
		if w.minShare > 0 && w.count > 0 {
			w.credit = min(w.credit+w.minShare, 1+w.minShare)
		}
	}
}

// canEvictFor says whether evicting lower-priority requests than e frees enough of lim for it.
func (mq *modelQueue) canEvictFor(e *Entry, lim Limits) bool {
	length, bytes := mq.length, mq.bytes
	for i := len(mq.bands) - 1; i >= 0 && (length+1 > lim.Length || bytes+e.Bytes > lim.Bytes); i-- {
		b := mq.bands[i]
		if b.priority >= e.Class.Priority {
			return false
		}
		for _, tq := range b.tenants {
			for _, w := range tq.entries {
				length, bytes = length-1, bytes-w.Bytes
			}
		}
	}
	return length+1 <= lim.Length && bytes+e.Bytes <= lim.Bytes
}

// yielder is the request that gives up its place to a late one of priority p: the newest of the lowest band
// below p, skipping those already ending; nil when none waits below p.
func (mq *modelQueue) yielder(p int, ending map[*Entry]Result) *Entry {
	for i := len(mq.bands) - 1; i >= 0 && mq.bands[i].priority < p; i-- {
		b := mq.bands[i]
		if b.count == 0 {
			continue
		}
		if len(ending) == 0 {
			return b.newest()
		}
		in := b.inOrder()
		slices.SortFunc(in, func(x, y *Entry) int { return cmp.Compare(y.seq, x.seq) })
		for _, e := range in {
			if _, ok := ending[e]; !ok {
				return e
			}
		}
	}
	return nil
}

// lowest is the entry to give up first: the newest of the lowest band's most recent tenant.
func (mq *modelQueue) lowest() *Entry {
	for i := len(mq.bands) - 1; i >= 0; i-- {
		if e := mq.bands[i].newest(); e != nil {
			return e
		}
	}
	return nil
}

// predictedWait is how long a request of priority p would wait behind those of higher priority and those of its
// own that are on time, at the measured drain rate; false while the rate is unknown.
func (mq *modelQueue) predictedWait(p int, now time.Time) (time.Duration, bool) {
	rate, ok := mq.drain.perSecond(now)
	if !ok {
		return 0, false
	}
	ahead := 0
	for _, b := range mq.bands {
		if b.priority > p || (b.priority == p && !b.late) {
			ahead += b.count
		}
	}
	if ahead == 0 {
		return 0, false // next in line: it starts with the next room, however slowly the queue drained before
	}
	return time.Duration(float64(ahead+1) / rate * float64(time.Second)), true
}

// retryAfter is how long the whole queue takes to drain: when a shed client may find room.
func (mq *modelQueue) retryAfter(now time.Time) time.Duration {
	rate, ok := mq.drain.perSecond(now)
	if !ok {
		return time.Second
	}
	d := time.Duration(float64(mq.length+1) / rate * float64(time.Second))
	return min(max(d, 100*time.Millisecond), time.Minute)
}
