package quota

import (
	"math"
	"sync"
	"time"
)

// localBackend is the fail-open limiter: the same limits, divided by the number of gateway replicas, kept in
// this process while Redis is unreachable.
type localBackend struct {
	mu       sync.Mutex
	counters map[string]*localCounter
	replicas int64
	swept    time.Time // last forgetExpired pass
}

type localCounter struct {
	value   int64
	expires time.Time
	holders map[string]bool // concurrency: ticket ids
	// unsynced is what was admitted here while Redis was unreachable (net of those requests' settlements):
	// Redis never counted it, so it is replayed there when Redis answers again.
	unsynced int64
	window   time.Duration
}

func newLocalBackend() *localBackend {
	return &localBackend{counters: map[string]*localCounter{}, replicas: 1}
}

func (l *localBackend) setReplicas(n int) {
	l.mu.Lock()
	l.replicas = int64(max(1, n))
	l.mu.Unlock()
}

func (l *localBackend) counter(key string, now time.Time, window time.Duration) *localCounter {
	c, ok := l.counters[key]
	if ok && !c.expires.IsZero() && now.After(c.expires) {
		ok = false
	}
	if !ok {
		c = &localCounter{holders: map[string]bool{}, window: window}
		if window > 0 {
			c.expires = now.Add(window)
		}
		l.counters[key] = c
	}
	return c
}

// maxLocalCounters is how many counters are kept before finished windows are swept out.
const maxLocalCounters = 100000

// forgetExpired drops counters of finished windows once there are many; l.mu is held.
func (l *localBackend) forgetExpired(now time.Time) {
	if len(l.counters) <= maxLocalCounters || now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	for k, c := range l.counters {
		if !c.expires.IsZero() && now.After(c.expires) {
			delete(l.counters, k)
		}
	}
}

// admit checks and reserves like the Redis script, at limit ÷ replicas (rounded up, at least 1). A window
// counter starts from the larger of what this gateway admitted in it and its share (÷ replicas) of what Redis
// last counted there (fleet, when known): a gateway that restarted within the window, or whose leases and
// other replicas used it, does not go on from its own count alone.
func (l *localBackend) admit(now time.Time, t *Ticket, fleet func(key string) (int64, bool)) *Rejection {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetExpired(now)
	for _, e := range t.entries {
		limit := max(1, int64(math.Ceil(float64(e.limit)/float64(l.replicas))))
		c := l.counter(e.key, now, e.window)
		if n, ok := fleetCount(fleet, e); ok {
			c.value = max(c.value, (n+l.replicas-1)/l.replicas)
		}
		used := c.value
		if e.kind == KindConcurrency {
			used = int64(len(c.holders))
		}
		if AddTokens(used, e.amount) > limit {
			reset := time.Second
			if !c.expires.IsZero() {
				reset = c.expires.Sub(now)
			}
			return &Rejection{Kind: e.kind, Scope: e.scope, Limit: limit, Used: used, Requested: e.amount, Reset: reset}
		}
	}
	l.add(now, t, !t.ambiguous) // a lost admission is resolved in Redis, not replayed there
	return nil
}

// fleetCount is what Redis last counted for a window entry's key, when fleet knows it.
func fleetCount(fleet func(key string) (int64, bool), e entry) (int64, bool) {
	if fleet == nil || (e.kind != KindRequests && e.kind != KindTokens) {
		return 0, false
	}
	n, ok := fleet(e.key)
	return n, ok && n > 0
}

// add counts a ticket's entries; unsynced marks amounts Redis never saw. l.mu is held.
func (l *localBackend) add(now time.Time, t *Ticket, unsynced bool) {
	for _, e := range t.entries {
		c := l.counter(e.key, now, e.window)
		switch {
		case e.kind == KindConcurrency:
			c.holders[t.ID] = true
		case unsynced:
			c.value, c.unsynced = AddTokens(c.value, e.amount), AddTokens(c.unsynced, e.amount)
		default:
			c.value = AddTokens(c.value, e.amount)
		}
	}
}

// record counts a ticket admitted through Redis or a lease without checking it: the local limiter mirrors what
// this gateway admitted in each window, so that when Redis fails it goes on from there instead of from zero.
func (l *localBackend) record(now time.Time, t *Ticket) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetExpired(now)
	l.add(now, t, false)
}

func (l *localBackend) settle(t *Ticket, deltas []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, e := range t.entries {
		c, ok := l.counters[e.key]
		if !ok {
			continue
		}
		if e.kind == KindConcurrency {
			delete(c.holders, t.ID)
		} else {
			c.value += deltas[i]
			if t.local && !t.ambiguous {
				c.unsynced = max(0, c.unsynced+deltas[i])
			}
		}
	}
}

// replay is one counter's unsynced amount, to add in Redis.
type replay struct {
	key    string
	amount int64
	window time.Duration
}

// takeUnsynced hands over what was admitted locally in windows still open and forgets it here.
func (l *localBackend) takeUnsynced(now time.Time) []replay {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []replay
	for k, c := range l.counters {
		if c.unsynced > 0 && (c.expires.IsZero() || now.Before(c.expires)) {
			out = append(out, replay{key: k, amount: c.unsynced, window: c.window})
		}
		c.unsynced = 0
	}
	return out
}

// restoreUnsynced gives back what a replay could not deliver, to be replayed at the next attempt (a counter whose
// window has ended since is not restored: nothing is left to add it to).
func (l *localBackend) restoreUnsynced(items []replay) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, it := range items {
		if c, ok := l.counters[it.key]; ok {
			c.unsynced += it.amount
		}
	}
}

// counted is this gateway's own count for a window counter, when it has one.
func (l *localBackend) counted(now time.Time, key string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.counters[key]
	if !ok || (!c.expires.IsZero() && now.After(c.expires)) {
		return 0, false
	}
	return c.value, true
}
