package quota

import (
	"math"
	"sync"
	"time"
)

// Local leases take Redis off most requests' path. A gateway reserves a slice of a limit in Redis ahead of
// requests (credit for counters, spare members for concurrency sets) and admits from it in process; it tops
// the slice up in the background before it runs out. Nothing is admitted that Redis has not counted, so
// leases never let a limit overshoot. What they cost is headroom: a slice one gateway holds is unavailable to
// the others until it is used, its window ends, or it is handed back after leaseIdle without use. One
// gateway's slice is the policy's leaseFraction ÷ gatewayReplicas of a limit, so all replicas together hold at
// most leaseFraction of it. Limits too small for a slice to cover two requests are not leased: every request
// asks Redis, exactly as without leases.

const (
	// leaseIdle is how long an unused slice stays with this gateway before it is handed back.
	leaseIdle = 2 * time.Second
	// maxLeaseSlots caps the concurrency slots one gateway holds spare for a key.
	maxLeaseSlots = 64
	// maxSpendLeaseRequests caps a monthly-spend lease at this many requests' estimated cost. Spend is the one
	// limit that does not heal by itself: credit a crashed gateway held stays charged until the month ends
	// (windows last a second or a minute, concurrency slots expire), so its lease is kept small.
	maxSpendLeaseRequests = 256
)

// leases is this gateway's reserved-but-unused share of every limit it has leased, by Redis key.
type leases struct {
	mu    sync.Mutex
	byKey map[string]*lease
	// answered is closed (and cleared) when a top-up is answered, for the requests waiting on one; nil while
	// nobody waits.
	answered chan struct{}
}

type lease struct {
	tenant  string
	kind    string
	size    int64     // target credit (counters) or spare slots (concurrency)
	credit  int64     // counter units reserved in Redis and not handed to a request
	free    []slot    // concurrency slots held in Redis and not in use
	expires time.Time // end of the key's window, when its credit is worthless; zero: none
	used    time.Time // last admission or settlement through this lease
	asked   int64     // top-ups asked of Redis and not answered yet: credit + asked never exceeds size
}

type slot struct {
	member  string
	expires time.Time // when Redis drops it (admission time + ConcurrencyTTL)
}

func newLeases() *leases { return &leases{byKey: map[string]*lease{}} }

// leaseSize is the slice of an entry's limit one gateway may hold, or 0 when the entry is not leased.
func leaseSize(e *entry, fraction float64, replicas int) int64 {
	if fraction <= 0 || e.kind == KindConversation {
		return 0
	}
	size := int64(math.Floor(float64(e.limit) * fraction / float64(max(1, replicas))))
	switch e.kind {
	case KindConcurrency:
		size = min(size, maxLeaseSlots)
	case KindSpend:
		size = min(size, maxSpendLeaseRequests*e.amount)
	}
	if size < 2*max(1, e.amount) {
		return 0
	}
	return size
}

// usable reports whether a spare slot still has enough life in Redis to carry a request.
func (s slot) usable(now time.Time) bool { return s.expires.Sub(now) > ConcurrencyTTL/2 }

// lookup returns the live lease of an entry's key, creating it when create is set.
func (ls *leases) lookup(now time.Time, tenant string, e *entry, create bool) *lease {
	l := ls.byKey[e.key]
	if l != nil && !l.expires.IsZero() && !now.Before(l.expires) {
		delete(ls.byKey, e.key) // the window is over; its counter is no longer charged
		l = nil
	}
	if l == nil && create {
		l = &lease{tenant: tenant, kind: e.kind}
		if e.kind == KindRequests || e.kind == KindTokens {
			w := e.window.Milliseconds()
			l.expires = time.UnixMilli((now.UnixMilli()/w + 1) * w)
		}
		ls.byKey[e.key] = l
	}
	return l
}

// cover pays each leased entry of t from this gateway's lease where it can. It reports whether every entry is
// covered (the request is admitted without Redis), and returns the top-ups to ask for in the background
// (entries with amount 0 and an extra) when a lease ran below half its size. When not every entry is
// covered, the entries that need a top-up carry their extra for the synchronous admission instead.
func (ls *leases) cover(now time.Time, t *Ticket, fraction float64, replicas int) (all bool, refill []entry) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	all = true
	for i := range t.entries {
		e := &t.entries[i]
		size := leaseSize(e, fraction, replicas)
		if size == 0 {
			all = false
			continue
		}
		l := ls.lookup(now, t.Tenant, e, true)
		l.size, l.used = size, now
		if e.kind == KindConcurrency {
			// Newest first; a slot too old to outlive the request stays for the sweep to hand back.
			for j := len(l.free) - 1; j >= 0; j-- {
				if s := l.free[j]; s.usable(now) {
					e.covered, e.member, e.memberExp = true, s.member, s.expires
					l.free = append(l.free[:j], l.free[j+1:]...)
					break
				}
			}
		} else if l.credit >= e.amount {
			l.credit -= e.amount
			e.covered = true
		}
		if !e.covered {
			all = false
		}
		// One top-up in flight per lease: while one is on its way, requests it does not cover yet ask Redis
		// for themselves only.
		if have := l.have(); l.asked == 0 && (have < size/2 || !e.covered) {
			e.extra = max(0, size-have)
			l.asked = e.extra
		}
	}
	if !all {
		return false, nil
	}
	for i := range t.entries {
		e := &t.entries[i]
		if e.extra > 0 {
			refill = append(refill, entry{kind: e.kind, scope: e.scope, key: e.key, limit: e.limit, window: e.window,
				covered: true, extra: e.extra})
			e.extra = 0
		}
	}
	return true, refill
}

func (l *lease) have() int64 {
	if l.kind == KindConcurrency {
		return int64(len(l.free))
	}
	return l.credit
}

// restore gives back what cover took, when the request is not admitted after all.
func (ls *leases) restore(now time.Time, t *Ticket) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i := range t.entries {
		e := &t.entries[i]
		if e.extra > 0 {
			ls.answer()
		}
		if l := ls.lookup(now, t.Tenant, e, e.covered); l != nil {
			l.asked = max(0, l.asked-e.extra)
			if e.covered && e.kind == KindConcurrency {
				l.free = append(l.free, slot{e.member, e.memberExp})
			} else if e.covered {
				l.credit += e.amount
			}
		}
		e.covered, e.extra, e.member = false, 0, ""
	}
}

// grant adds the top-ups Redis granted (per entry of an admission or a refill ticket with id) to the leases;
// granted is nil when the call failed.
func (ls *leases) grant(now time.Time, tenant, id string, entries []entry, granted []int64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i := range entries {
		e := &entries[i]
		var g int64
		if i < len(granted) {
			g = granted[i]
		}
		if e.extra > 0 {
			ls.answer()
		}
		l := ls.lookup(now, tenant, e, g > 0)
		if l == nil {
			continue
		}
		l.asked = max(0, l.asked-e.extra)
		if e.kind == KindConcurrency {
			for j := int64(1); j <= g; j++ {
				l.free = append(l.free, slot{extraMember(id, j), now.Add(ConcurrencyTTL)})
			}
		} else {
			l.credit += g
		}
	}
}

// settle applies a finished request's corrections to the leases where its keys are leased — a refund becomes
// credit, a charge is paid from credit, a concurrency slot goes back to the spare set — and returns what
// must still go to Redis.
func (ls *leases) settle(now time.Time, t *Ticket, deltas []int64) []settleItem {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var items []settleItem
	for i := range t.entries {
		e := &t.entries[i]
		if e.kind == KindRequests {
			continue
		}
		l := ls.lookup(now, t.Tenant, e, false)
		if e.kind == KindConcurrency {
			s := slot{e.member, e.memberExp}
			if s.member == "" {
				s = slot{t.ID, t.at.Add(ConcurrencyTTL)}
			}
			if l != nil && s.usable(now) {
				l.free = append(l.free, s)
				l.used = now
			} else {
				items = append(items, settleItem{key: e.key, kind: e.kind, member: s.member})
			}
			continue
		}
		d := deltas[i]
		if l != nil && d != 0 {
			l.used = now
			if d < 0 {
				// Refunds refill the lease, up to twice its size; the sweep hands back what is above size.
				keep := min(-d, max(0, 2*l.size-l.credit))
				l.credit += keep
				d += keep
			} else {
				pay := min(d, l.credit)
				l.credit -= pay
				d -= pay
			}
		}
		if d != 0 {
			items = append(items, settleItem{key: e.key, kind: e.kind, delta: d})
		}
	}
	return items
}

// handBack is what a sweep returns to Redis for one tenant.
type handBack struct {
	tenant string
	items  []settleItem
}

// sweep forgets leases whose window ended and hands back those unused for leaseIdle (all of them when all
// is set, at shutdown), along with spare concurrency slots too old to carry a request.
func (ls *leases) sweep(now time.Time, all bool) []handBack {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	byTenant := map[string][]settleItem{}
	for key, l := range ls.byKey {
		if !l.expires.IsZero() && !now.Before(l.expires) {
			delete(ls.byKey, key)
			continue
		}
		idle := all || now.Sub(l.used) >= leaseIdle
		if idle && l.asked > 0 && !all {
			continue // a top-up is on its way; hand back on a later sweep
		}
		kept := l.free[:0]
		for _, s := range l.free {
			// Spares above the lease's size (slots of finished requests) go back too.
			if idle || !s.usable(now) || int64(len(kept)) >= l.size {
				byTenant[l.tenant] = append(byTenant[l.tenant], settleItem{key: key, kind: l.kind, member: s.member})
			} else {
				kept = append(kept, s)
			}
		}
		l.free = kept
		if idle {
			if l.credit > 0 {
				byTenant[l.tenant] = append(byTenant[l.tenant], settleItem{key: key, kind: l.kind, delta: -l.credit})
			}
			delete(ls.byKey, key)
		} else if excess := l.credit - l.size; excess > 0 && l.kind != KindConcurrency {
			byTenant[l.tenant] = append(byTenant[l.tenant], settleItem{key: key, kind: l.kind, delta: -excess})
			l.credit = l.size
		}
	}
	out := make([]handBack, 0, len(byTenant))
	for tenant, items := range byTenant {
		out = append(out, handBack{tenant, items})
	}
	return out
}

// holds reports whether the lease of the entry a rejection names now holds enough for the request, which a
// Redis rejection can mean when a concurrent top-up for this gateway took the limit's last units. While it
// does not and a top-up is on its way to that lease, it also returns a channel closed when the next top-up
// is answered.
func (ls *leases) holds(now time.Time, t *Ticket, rej *Rejection) (enough bool, answered <-chan struct{}) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for i := range t.entries {
		e := &t.entries[i]
		if e.kind != rej.Kind || e.scope != rej.Scope {
			continue
		}
		l := ls.lookup(now, t.Tenant, e, false)
		switch {
		case l == nil:
			return false, nil
		case l.have() >= max(1, e.amount):
			return true, nil
		case l.asked == 0:
			return false, nil
		}
		if ls.answered == nil {
			ls.answered = make(chan struct{})
		}
		return false, ls.answered
	}
	return false, nil
}

// answer wakes the requests waiting for a top-up; the caller holds mu.
func (ls *leases) answer() {
	if ls.answered != nil {
		close(ls.answered)
		ls.answered = nil
	}
}
