package quota

import (
	"sync"
	"time"
)

// Budget is what is left of one of a tenant's rate limits after an admission, for the x-ratelimit-* headers
// OpenAI sends on every response (SDK users read their remaining budget from successful responses).
type Budget struct {
	Kind      string // KindRequests or KindTokens
	Limit     int64
	Remaining int64
	Reset     time.Duration // until the window ends
}

// Budgets are the tenant-wide request and token budgets after the ticket's admission. Remaining is what Redis
// last counted in the window (leases this gateway holds included, so it errs low), less nothing else: other
// gateways' admissions since then show at their next contact with Redis.
func (t *Ticket) Budgets() []Budget {
	if t == nil {
		return nil
	}
	return t.budgets[:t.nBudgets]
}

// counters remembers the value Redis last reported for each window counter.
type counters struct {
	mu    sync.Mutex
	byKey map[string]countedValue
}

type countedValue struct {
	value   int64
	expires time.Time // the window's end: later, the key is a new window's
}

// maxCounted bounds the counters remembered; past it, those of windows that ended are forgotten.
const maxCounted = 4096

// note records the counters an admission read (-1: not read).
func (c *counters) note(now time.Time, entries []entry, after []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil {
		c.byKey = map[string]countedValue{}
	}
	for i := range entries {
		e := &entries[i]
		if after[i] < 0 || (e.kind != KindRequests && e.kind != KindTokens) {
			continue
		}
		c.byKey[e.key] = countedValue{value: after[i], expires: windowEnd(now, e.window)}
	}
	if len(c.byKey) > maxCounted {
		for k, v := range c.byKey {
			if !now.Before(v.expires) {
				delete(c.byKey, k)
			}
		}
	}
}

// value is what Redis last counted for a key in its window.
func (c *counters) value(now time.Time, key string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.byKey[key]
	if !ok || !now.Before(v.expires) {
		return 0, false
	}
	return v.value, true
}

// windowEnd is when the fixed window holding now ends (windows count from the Unix epoch, as windowID).
func windowEnd(now time.Time, window time.Duration) time.Time {
	wms := window.Milliseconds()
	if wms <= 0 {
		return now
	}
	return time.UnixMilli((now.UnixMilli()/wms + 1) * wms)
}

// budgets computes a ticket's tenant-wide budgets: from what Redis counted, or, for an admission under the
// fail-open limiter, from this gateway's own count.
func (l *Limiter) budgets(now time.Time, t *Ticket) {
	for i := range t.entries {
		e := &t.entries[i]
		if e.scope != "tenant" || (e.kind != KindRequests && e.kind != KindTokens) {
			continue
		}
		used, ok := l.redis.counted.value(now, e.key)
		if t.local || !ok {
			used, ok = l.local.counted(now, e.key)
		}
		if !ok {
			used = e.amount
		}
		if t.nBudgets == len(t.budgets) {
			return
		}
		t.budgets[t.nBudgets] = Budget{Kind: e.kind, Limit: e.limit, Remaining: max(0, e.limit-used),
			Reset: windowEnd(now, e.window).Sub(now)}
		t.nBudgets++
	}
}
