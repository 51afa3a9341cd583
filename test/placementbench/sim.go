package main

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/fleetsim"
)

// epoch is the simulated clock's zero.
var epoch = time.Unix(1_700_000_000, 0)

// scrapeEvery and staleAfter are the gateway's scrape interval and staleness bound, in simulated time.
const (
	scrapeEvery = 100 * time.Millisecond
	staleAfter  = time.Second
)

// sim is a discrete-event loop in simulated time: the fleet's engines, the scraper's rounds and the admission
// queue's timers are events; nothing in it waits for the machine's clock, so the figures do not depend on how
// busy the machine is.
type sim struct {
	mu     sync.Mutex // the queue's waiters schedule timers from their own goroutines
	now    time.Duration
	events events
	seq    uint64
	// parked, while the loop waits for an admission-queue waiter to settle, is what tells it the waiter's entry
	// is parked (see gateway.queued).
	parked atomic.Pointer[parked]
}

type event struct {
	at        time.Duration
	seq       uint64
	f         func()
	cancelled bool
}

type events []*event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// after schedules f at d from now.
func (s *sim) after(d time.Duration, f func()) *event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	e := &event{at: s.now + max(0, d), seq: s.seq, f: f}
	heap.Push(&s.events, e)
	return e
}

// run executes events in time order until none is left or until is passed (0: no limit).
func (s *sim) run() {
	for {
		s.mu.Lock()
		if len(s.events) == 0 {
			s.mu.Unlock()
			return
		}
		e := heap.Pop(&s.events).(*event)
		if e.cancelled {
			s.mu.Unlock()
			continue
		}
		s.now = e.at
		s.mu.Unlock()
		e.f()
	}
}

// Now is the simulated time (the admission queue's clock).
func (s *sim) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return epoch.Add(s.now)
}

// AfterFunc schedules f in simulated time (the admission queue's timers); it tells a waiter being synchronised
// with that its entry is now parked (see gateway.queued).
func (s *sim) AfterFunc(d time.Duration, f func()) func() bool {
	e := s.after(d, f)
	if p := s.parked.Load(); p != nil {
		p.once.Do(func() { close(p.ch) })
	}
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		stopped := !e.cancelled && e.at >= s.now
		e.cancelled = true
		return stopped
	}
}

// replica is one simulated engine and what the scraper last read of it.
type replica struct {
	addr     string
	class    *class
	eng      *fleetsim.VirtualEngine
	stepping bool
	reading  fleet.EngineMetrics
	onFirst  map[*fleetsim.Sequence]func()
	onDone   map[*fleetsim.Sequence]func(*fleetsim.Sequence)
}

// fleetState is the scenario's running fleet: the engines by address, stepped by the sim.
type fleetState struct {
	sim      *sim
	replicas []*replica
	byAddr   map[string]*replica
	mu       sync.Mutex // readings are read by the queue's waiters' Try
	onRound  func()     // after every scrape round (the admission queue is kicked)
	end      time.Duration
}

// newFleet builds the scenario's replicas, class by class, each named 10.0.<class>.<replica><port>.
func newFleet(s *scenario, sm *sim, port string) (*fleetState, [][]string) {
	f := &fleetState{sim: sm, byAddr: map[string]*replica{}}
	endpoints := make([][]string, len(s.classes))
	for i := range s.classes {
		c := &s.classes[i]
		for r := range c.replicas {
			addr := "10.0." + itoa(i) + "." + itoa(r+1) + port
			rp := &replica{addr: addr, class: c, onFirst: map[*fleetsim.Sequence]func(){}, onDone: map[*fleetsim.Sequence]func(*fleetsim.Sequence){},
				eng: fleetsim.NewVirtualEngine(fleetsim.EngineConfig{Hardware: c.speed, BlockSize: blockSize, NumGPUBlocks: c.numGPUBlocks,
					MaxNumSeqs: c.maxNumSeqs})}
			f.replicas = append(f.replicas, rp)
			f.byAddr[addr] = rp
			endpoints[i] = append(endpoints[i], addr)
		}
	}
	return f, endpoints
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// Metrics implements picker.EngineView: the last scrape's reading, fresh while under staleAfter old.
func (f *fleetState) Metrics(addr string) (fleet.EngineMetrics, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.byAddr[addr]
	if !ok || r.reading.At.IsZero() {
		return fleet.EngineMetrics{}, false
	}
	return r.reading, f.sim.Now().Sub(r.reading.At) <= staleAfter
}

// scrape reads every engine, as one scraper round does, and schedules the next round until the run's end.
func (f *fleetState) scrape() {
	now := f.sim.Now()
	f.mu.Lock()
	for _, r := range f.replicas {
		running, waiting, kv := r.eng.Load()
		prompt, cached := r.eng.PromptCounters()
		r.reading = fleet.EngineMetrics{Running: float64(running), Waiting: float64(waiting), KVUtil: kv, BlockSize: blockSize,
			NumBlocks: r.class.numGPUBlocks, PromptTokens: float64(prompt), CachedPromptTokens: float64(cached), At: now}
	}
	f.mu.Unlock()
	if f.onRound != nil {
		f.onRound()
	}
	if f.sim.now < f.end {
		f.sim.after(scrapeEvery, f.scrape)
	}
}

// submit starts a request on a replica now; first is called when its first token comes, done when it retires
// (nil error) or at once when the engine refuses it.
func (f *fleetState) submit(addr string, tokens []string, output int, first func(), done func(*fleetsim.Sequence, error)) {
	r := f.byAddr[addr]
	seq, err := r.eng.Submit(f.sim.Now(), tokens, output)
	if err != nil {
		done(nil, err)
		return
	}
	r.onFirst[seq], r.onDone[seq] = first, func(q *fleetsim.Sequence) { done(q, nil) }
	if !r.stepping {
		f.step(r)
	}
}

// step plans the replica's next step and schedules its end.
func (f *fleetState) step(r *replica) {
	d, busy := r.eng.Step(f.sim.Now())
	r.stepping = busy
	if !busy {
		return
	}
	f.sim.after(d, func() {
		firstTokens, finished := r.eng.Finish(f.sim.Now())
		for _, q := range firstTokens {
			first := r.onFirst[q]
			delete(r.onFirst, q)
			first()
		}
		for _, q := range finished {
			done := r.onDone[q]
			delete(r.onDone, q)
			done(q)
		}
		f.step(r)
	})
}

// busy is the engines' simulated busy time, by replica.
func (f *fleetState) cost() float64 {
	usd := 0.0
	for _, r := range f.replicas {
		usd += r.eng.BusyTime().Hours() * r.class.price
	}
	return usd
}
