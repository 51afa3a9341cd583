package admission

import (
	"slices"
	"time"
)

// band is one priority's waiting requests, shared between its tenants by start-time fair queuing: each
// request is tagged with a virtual start (the later of the band's virtual time and its tenant's previous
// finish) and finish (start + cost ÷ weight); the request with the smallest finish goes first. A tenant that
// sends many requests runs ahead in virtual time and waits behind the others; within a tenant, first come
// first served.
type band struct {
	priority int
	minShare float64
	credit   float64 // starts owed to this band by its minimum share
	vclock   float64
	tenants  map[string]*tenantQueue
	count    int
}

type tenantQueue struct {
	entries    []*Entry
	lastFinish float64
}

func (b *band) push(e *Entry) {
	tq, ok := b.tenants[e.Tenant]
	if !ok {
		tq = &tenantQueue{}
		b.tenants[e.Tenant] = tq
	}
	start := b.vclock
	if len(tq.entries) > 0 || tq.lastFinish > start {
		start = max(start, tq.lastFinish)
	}
	e.start = start
	e.finish = start + float64(max(e.Cost, 1))/e.Class.Weight
	tq.lastFinish = e.finish
	tq.entries = append(tq.entries, e)
	b.count++
}

// next is the head with the smallest finish tag (ties: the earlier arrival).
func (b *band) next() *Entry {
	var best *Entry
	for _, tq := range b.tenants {
		if len(tq.entries) == 0 {
			continue
		}
		h := tq.entries[0]
		if best == nil || h.finish < best.finish || (h.finish == best.finish && h.seq < best.seq) {
			best = h
		}
	}
	return best
}

// newest is the band's most recently queued entry.
func (b *band) newest() *Entry {
	var last *Entry
	for _, tq := range b.tenants {
		if n := len(tq.entries); n > 0 && (last == nil || tq.entries[n-1].seq > last.seq) {
			last = tq.entries[n-1]
		}
	}
	return last
}

// remove takes e out, reporting whether it was there.
func (b *band) remove(e *Entry) bool {
	tq, ok := b.tenants[e.Tenant]
	if !ok {
		return false
	}
	i := slices.Index(tq.entries, e)
	if i < 0 {
		return false
	}
	tq.entries = slices.Delete(tq.entries, i, i+1)
	b.count--
	if len(tq.entries) == 0 && tq.lastFinish <= b.vclock {
		delete(b.tenants, e.Tenant) // an idle tenant keeps no state
	}
	return true
}

// drainRate measures how fast a queue starts requests: the last starts' times.
type drainRate struct {
	times [32]time.Time
	n     int // starts recorded, saturating at len(times)
	next  int
}

// minDrainSamples is how many starts the rate needs before the queue trusts it.
const minDrainSamples = 8

func (d *drainRate) record(now time.Time) {
	d.times[d.next] = now
	d.next = (d.next + 1) % len(d.times)
	d.n = min(d.n+1, len(d.times))
}

// perSecond is the starts per second over the recorded window, counted up to now so that a queue that
// stopped draining is seen to have slowed.
func (d *drainRate) perSecond(now time.Time) (float64, bool) {
	if d.n < minDrainSamples {
		return 0, false
	}
	oldest := d.times[(d.next-d.n+len(d.times))%len(d.times)]
	span := now.Sub(oldest).Seconds()
	if span <= 0 {
		return 0, false
	}
	return float64(d.n) / span, true
}
