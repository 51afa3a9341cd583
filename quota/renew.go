package quota

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Concurrency slots live in Redis for a short ConcurrencyTTL and are renewed while their request lasts, so a
// gateway that dies (SIGKILL, OOM, a lost node) stops holding its tenants' slots within seconds instead of
// locking them out until a long TTL ends.

// renewEvery is how often the slots of requests still in flight are renewed: three times per TTL, so a slot
// survives two lost renewals and a spare slot's remaining life stays above the half that usable() asks.
const renewEvery = ConcurrencyTTL / 3

// liveSlots are the concurrency slots this gateway holds in Redis for requests in flight, by ticket id.
type liveSlots struct {
	mu      sync.Mutex
	tickets map[string]*Ticket
}

func newLiveSlots() *liveSlots { return &liveSlots{tickets: map[string]*Ticket{}} }

// add registers an admitted ticket that holds concurrency slots in Redis.
func (ls *liveSlots) add(t *Ticket) {
	if t.local || !t.holdsSlot() {
		return
	}
	ls.mu.Lock()
	ls.tickets[t.ID] = t
	ls.mu.Unlock()
}

// remove stops renewing a ticket's slots; after it returns the renewer no longer touches the ticket.
func (ls *liveSlots) remove(t *Ticket) {
	ls.mu.Lock()
	delete(ls.tickets, t.ID)
	ls.mu.Unlock()
}

func (t *Ticket) holdsSlot() bool {
	for i := range t.entries {
		if t.entries[i].kind == KindConcurrency {
			return true
		}
	}
	return false
}

// renewal is one slot to extend.
type renewal struct{ key, member string }

// due lists every live slot; the slot's member is fixed here (the ticket id when it did not come from a
// lease), so that settlement frees the slot renewed.
func (ls *liveSlots) due() []renewal {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []renewal
	for _, t := range ls.tickets {
		for i := range t.entries {
			e := &t.entries[i]
			if e.kind != KindConcurrency {
				continue
			}
			if e.member == "" {
				e.member, e.memberExp = t.ID, t.at.Add(ConcurrencyTTL)
			}
			out = append(out, renewal{e.key, e.member})
		}
	}
	return out
}

// renewed records the new expiry of slots still live, for settlement's decision to keep a slot as a spare.
func (ls *liveSlots) renewed(exp time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, t := range ls.tickets {
		for i := range t.entries {
			if e := &t.entries[i]; e.kind == KindConcurrency && e.memberExp.Before(exp) {
				e.memberExp = exp
			}
		}
	}
}

// renewSlots extends every live slot to now + ConcurrencyTTL in one pipeline. ZADD XX never re-adds a slot
// that a settlement freed meanwhile, GT never shortens one; each set's own expiry moves with its members.
func (l *Limiter) renewSlots(ctx context.Context) error {
	due := l.live.due()
	if len(due) == 0 {
		return nil
	}
	now := l.now()
	exp := now.Add(ConcurrencyTTL)
	byKey := map[string][]redis.Z{}
	for _, r := range due {
		byKey[r.key] = append(byKey[r.key], redis.Z{Score: float64(exp.UnixMilli()), Member: r.member})
	}
	_, err := l.redis.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for key, members := range byKey {
			p.ZAddArgs(ctx, key, redis.ZAddArgs{XX: true, GT: true, Members: members})
			p.PExpire(ctx, key, ConcurrencyTTL)
		}
		return nil
	})
	if err == nil {
		l.live.renewed(exp)
	}
	return err
}

// runRenewer renews live slots every interval until ctx ends. A failed renewal is tried again on the next
// tick; slots outlive two failures.
func (l *Limiter) runRenewer(ctx context.Context, every, timeout time.Duration) {
	everyTick(ctx, every, func() {
		if !l.up.Load() {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		if err := l.renewSlots(cctx); err != nil {
			l.log.Warn("renewing concurrency slots failed; retrying on the next tick", "err", redactAddr(err))
		}
		cancel()
	})
}

// everyTick calls fn every interval until ctx ends.
func everyTick(ctx context.Context, every time.Duration, fn func()) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fn()
		}
	}
}
