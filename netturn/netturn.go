// Package netturn gives the network its turn while long CPU-bound work runs. Go's scheduler reads ready
// sockets when a P has no goroutine left to run, or from sysmon once none has for 10 ms (findRunnable and
// sysmon, runtime/proc.go); runtime.Gosched only moves a goroutine to the back of the run queue. So while large
// request bodies keep every P busy, an ordinary request's bytes wait unread in their socket for up to 10 ms, and
// its decision with them (RELIABILITY.md, "Hostile bodies"). Yield, called between slices of such work, parks
// its callers until the scheduler next polls the network, at most once every Every: the goroutines already
// runnable go first, then the ones the poll finds, then the work again.
package netturn

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Every is how long CPU-bound work may keep the network waiting. Measured with `make bench-bodies` (one CPU,
// 64 hostile 4 MiB bodies, FULL_DUPLEX_STREAMED, 2026-12-06): ordinary decisions' p99 under attack was 21 ms
// with Gosched alone, about 2.8 ms with a turn every 250 µs, 1.2-1.7 ms every 100 µs and 1.2 ms every 50 µs
// (RELIABILITY.md). A turn costs about 3 µs (BenchmarkTurn): 6 % of the CPU such work gets, while it saturates it.
const Every = 50 * time.Microsecond

// maxTurn bounds a turn: sysmon polls the network within 10 ms anyway, so a turn whose wake-up was lost ends
// no later than the runtime would have let the network in.
const maxTurn = 10 * time.Millisecond

// Turns hands the network turns between slices of CPU-bound work. A turn's taker parks on a pipe the network
// poller watches, into which a goroutine of its own writes a byte: a goroutine parked on a file descriptor is
// woken only by a poll, so the taker runs again after the next one, which comes once the goroutines ahead of
// it have run, or at once on an idle P. Every other caller of Yield meanwhile waits for the turn to end.
type Turns struct {
	every  time.Duration
	epoch  time.Time
	last   atomic.Int64 // when the last turn ended, in nanoseconds since epoch
	broken atomic.Bool  // the pipe failed: Yield only yields the processor
	taken  atomic.Int64

	mu      sync.Mutex
	current chan struct{} // closed when the turn under way ends; nil between turns

	r, w *os.File
	buf  [64]byte // the taker's read; one turn at a time
}

// bell is the byte that ends a turn.
var bell = []byte{1}

// New returns Turns that let the network in at most every every.
func New(every time.Duration) (*Turns, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &Turns{every: every, epoch: time.Now(), r: r, w: w}, nil
}

// Close releases the pipe; Yield then only yields the processor.
func (t *Turns) Close() error {
	t.broken.Store(true)
	return errors.Join(t.r.Close(), t.w.Close())
}

// Taken reports how many turns the network has had.
func (t *Turns) Taken() int64 { return t.taken.Load() }

// Yield is called between slices of CPU-bound work: it lets the goroutines waiting for the processor run and,
// when the last turn ended every ago or more, waits until the scheduler has polled the network.
func (t *Turns) Yield() {
	if t.broken.Load() || t.sinceLast() < t.every {
		runtime.Gosched()
		return
	}
	t.mu.Lock()
	if c := t.current; c != nil {
		t.mu.Unlock()
		<-c
		return
	}
	if t.sinceLast() < t.every { // a turn ended while this caller waited for the lock
		t.mu.Unlock()
		runtime.Gosched()
		return
	}
	c := make(chan struct{})
	t.current = c
	t.mu.Unlock()

	t.waitForPoll()
	t.last.Store(int64(time.Since(t.epoch)))
	t.taken.Add(1)
	t.mu.Lock()
	t.current = nil
	t.mu.Unlock()
	close(c)
}

func (t *Turns) sinceLast() time.Duration {
	return time.Since(t.epoch) - time.Duration(t.last.Load())
}

// waitForPoll parks the caller on the pipe until a poll finds the byte ring writes, or maxTurn passes.
func (t *Turns) waitForPoll() {
	if err := t.r.SetReadDeadline(time.Now().Add(maxTurn)); err != nil {
		t.broken.Store(true)
		return
	}
	go t.ring()
	if _, err := t.r.Read(t.buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.broken.Store(true)
	}
}

// ring writes the byte that ends the turn. It runs after the taker has parked (or, on another P, before: the
// turn then ends at once).
func (t *Turns) ring() {
	if _, err := t.w.Write(bell); err != nil {
		t.broken.Store(true)
	}
}

// process is the Turns of Yield: the scheduler is the process's, and so are its turns.
var process = sync.OnceValue(func() *Turns {
	t, err := New(Every)
	if err != nil {
		return nil
	}
	return t
})

// Yield is the process's Turns' Yield (runtime.Gosched when its pipe could not be made).
func Yield() {
	if t := process(); t != nil {
		t.Yield()
		return
	}
	runtime.Gosched()
}

// Taken reports how many turns the process's Turns have given the network.
func Taken() int64 {
	if t := process(); t != nil {
		return t.Taken()
	}
	return 0
}
