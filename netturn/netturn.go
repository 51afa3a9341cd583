// Package netturn gives the network its turn while long CPU-bound work runs. Go's scheduler reads ready
// sockets when a P has no goroutine left to run, when the world restarts after a stop, or from sysmon once none
// has for 10 ms; runtime.Gosched only moves a goroutine to the back of the run queue. So while large request
// bodies keep every P busy, an ordinary request's bytes wait unread in their socket for up to 10 ms, and its
// decision with them (RELIABILITY.md, "Hostile bodies"). Yield, called between slices of such work, parks its
// callers until the scheduler next polls the network, at most once every Every: the goroutines already
// runnable go first, then the ones the poll finds (and the ones they ready), then the work again.
package netturn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Every is how long CPU-bound work may keep the network waiting. Measured with `make bench-bodies` (one CPU,
// 64 hostile 4 MiB bodies, FULL_DUPLEX_STREAMED, 2026-12-06, one run each, while this package took shape):
// ordinary decisions' p99 under attack was 20 ms with Gosched alone, 2.8 ms with a turn every 250 µs, 1.2-1.8 ms
// every 100 µs and 0.9-1.2 ms every 50 µs; RELIABILITY.md has the figures at the current code. A turn costs
// about 3 µs (BenchmarkTurn): 6 % of the CPU such work gets while it saturates it.
const Every = 50 * time.Microsecond

// maxTurn bounds a turn. A turn ends at the first poll, which comes once the run queue empties; when other work
// keeps the queue full that long, parking the large bodies has not brought the poll nearer (sysmon's comes
// within 10 ms anyway), and they go on. So while ordinary work alone saturates the CPU, large bodies advance
// Every in maxTurn: the gateway favours ordinary requests. In the bench (one run each) turns bounded at 10, 2
// and 1 ms (the last waiting 1 ms more after a lapse) gave ordinary p99 0.8, 0.9 and 1.4 ms under attack.
const maxTurn = 2 * time.Millisecond

// Turns hands the network turns between slices of CPU-bound work. A turn's taker parks on a pipe the network
// poller watches, into which a goroutine of its own writes the turn's byte: a goroutine parked on a file
// descriptor is woken only by a poll (or its deadline), so the taker runs again after the next one, which
// comes once the goroutines ahead of it have run, or at once on an idle P. Every other caller of Yield
// meanwhile waits for the turn to end.
type Turns struct {
	every  time.Duration
	epoch  time.Time
	next   atomic.Int64 // when a turn is due next, in nanoseconds since epoch
	broken atomic.Bool  // the pipe failed: Yield only yields the processor
	polled atomic.Int64 // turns that ended at a poll
	lapsed atomic.Int64 // turns that ended at maxTurn

	mu      sync.Mutex
	current chan struct{} // closed when the turn under way ends; nil between turns

	// The taker's alone: one turn at a time.
	r, w *os.File
	seq  byte // the byte of the turn under way; a late byte of an earlier turn is read and dropped
	buf  [64]byte
}

// New returns Turns that let the network in at most every every. It needs a pipe: a process out of file
// descriptors gets an error, and should then yield with runtime.Gosched.
func New(every time.Duration) (*Turns, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("netturn: the pipe the poller watches: %w", err)
	}
	return &Turns{every: every, epoch: time.Now(), r: r, w: w}, nil
}

// Close releases the pipe; Yield then only yields the processor.
func (t *Turns) Close() error {
	t.broken.Store(true)
	return errors.Join(t.r.Close(), t.w.Close())
}

// Taken reports how many turns ended at a poll and how many at maxTurn: what tests and benchmarks check.
func (t *Turns) Taken() (polled, lapsed int64) { return t.polled.Load(), t.lapsed.Load() }

// Yield is called between slices of CPU-bound work: it lets the goroutines waiting for the processor run and,
// when a turn is due, waits until the scheduler has polled the network.
func (t *Turns) Yield() {
	if t.broken.Load() || !t.due() {
		runtime.Gosched()
		return
	}
	t.mu.Lock()
	if c := t.current; c != nil {
		t.mu.Unlock()
		<-c
		return
	}
	if !t.due() { // a turn ended while this caller waited for the lock
		t.mu.Unlock()
		runtime.Gosched()
		return
	}
	c := make(chan struct{})
	t.current = c
	t.mu.Unlock()

	if t.waitForPoll() {
		// The poll readied the taker among the goroutines it found, maybe first: they run before the turn's
		// waiters are released to queue ahead of them.
		runtime.Gosched()
	}
	t.next.Store(int64(time.Since(t.epoch) + t.every))
	t.mu.Lock()
	t.current = nil
	t.mu.Unlock()
	close(c)
}

func (t *Turns) due() bool { return int64(time.Since(t.epoch)) >= t.next.Load() }

// waitForPoll parks the caller on the pipe until a poll finds the turn's byte (true), or maxTurn passes.
func (t *Turns) waitForPoll() bool {
	if err := t.r.SetReadDeadline(time.Now().Add(maxTurn)); err != nil {
		t.broken.Store(true)
		return false
	}
	t.seq++
	go t.ring(t.seq)
	for {
		n, err := t.r.Read(t.buf[:])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.lapsed.Add(1)
			return false
		}
		if err != nil {
			t.broken.Store(true)
			return false
		}
		if bytes.IndexByte(t.buf[:n], t.seq) >= 0 { // its own byte, among earlier turns' late ones
			t.polled.Add(1)
			return true
		}
	}
}

// ring writes a turn's byte. It runs after the taker has parked (or, on another P, before: the turn then ends
// at once).
func (t *Turns) ring(seq byte) {
	if _, err := t.w.Write(seqBytes[seq : int(seq)+1]); err != nil {
		t.broken.Store(true)
	}
}

// seqBytes holds every byte value, so that ring writes one without allocating it.
var seqBytes = func() (b [256]byte) {
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// processTurns are the Turns of Yield: the scheduler is the process's, and so are its turns.
var processTurns = sync.OnceValues(func() (*Turns, error) { return New(Every) })

// Start makes the process's Turns (a pipe) if it has not yet, and returns why it could not: a server calls it
// as it starts, to say so once, rather than on the request path.
func Start() error {
	_, err := processTurns()
	return err
}

// Yield is the process's Turns' Yield (runtime.Gosched when its pipe could not be made).
func Yield() {
	if t, err := processTurns(); err == nil {
		t.Yield()
		return
	}
	runtime.Gosched()
}

// Taken is the process's Turns' Taken.
func Taken() (polled, lapsed int64) {
	if t, err := processTurns(); err == nil {
		return t.Taken()
	}
	return 0, 0
}
