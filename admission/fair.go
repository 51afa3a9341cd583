package admission

import (
	"cmp"
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
	late     bool // its requests are past their due time (modelQueue.band)
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

// heads are the tenants' first entries, the smallest finish tag first (ties: the earlier arrival).
func (b *band) heads() []*Entry {
	if b.count == 0 {
		return nil
	}
	out := make([]*Entry, 0, len(b.tenants))
	for _, tq := range b.tenants {
		if len(tq.entries) > 0 {
			out = append(out, tq.entries[0])
		}
	}
	slices.SortFunc(out, byTag)
	return out
}

// inOrder is every waiting entry of the band in the order fair queuing would start them if none arrived:
// the smallest finish tag first (ties: the earlier arrival).
func (b *band) inOrder() []*Entry {
	out := make([]*Entry, 0, b.count)
	for _, tq := range b.tenants {
		out = append(out, tq.entries...)
	}
	slices.SortFunc(out, byTag)
	return out
}

func byTag(x, y *Entry) int {
	if x.finish != y.finish {
		return cmp.Compare(x.finish, y.finish)
	}
	return cmp.Compare(x.seq, y.seq)
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
	if !e.started && i == len(tq.entries) {
		// The tenant's newest request left without being served: it is not charged for it.
		tq.lastFinish = e.start
		if n := len(tq.entries); n > 0 {
			tq.lastFinish = tq.entries[n-1].finish
		}
	}
	if len(tq.entries) == 0 && tq.lastFinish <= b.vclock {
		delete(b.tenants, e.Tenant) // an idle tenant keeps no state
	}
	return true
}

// drainWindow is how far back the drain rate looks: starts older than this say nothing of the queue now.
const drainWindow = 10 * time.Second

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

// perSecond is the starts per second over the recorded starts of the last drainWindow, counted up to now so
// that a queue that stopped draining is seen to have slowed; unknown with fewer than minDrainSamples of them.
func (d *drainRate) perSecond(now time.Time) (float64, bool) {
	recent := 0
	var oldest time.Time
	for i := range d.n { // newest first
		t := d.times[(d.next-1-i+2*len(d.times))%len(d.times)]
		if now.Sub(t) > drainWindow {
			break
		}
		recent, oldest = recent+1, t
	}
	if recent < minDrainSamples {
		return 0, false
	}
	span := now.Sub(oldest).Seconds()
	if span <= 0 {
		return 0, false
	}
	return float64(recent) / span, true
}
