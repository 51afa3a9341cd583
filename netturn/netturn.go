// Package netturn gives the network its turn while long CPU-bound work runs. Go's scheduler reads ready
// sockets when a P has no goroutine left to run, when the world restarts after a stop, or from sysmon once none
// has for 10 ms; runtime.Gosched only moves a goroutine to the back of the run queue. So while large request
// bodies keep every P busy, an ordinary request's bytes wait unread in their socket for up to 10 ms, and its
// decision with them (RELIABILITY.md, "Hostile bodies"). Yield, called between slices of such work, parks its
// callers, at most once every Every, and lets them go on one per P at each poll of the network: the goroutines
// already runnable go first, then the ones the poll finds (and the ones they ready), then a slice of the work.
package netturn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
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

// Turns hands the network turns between slices of CPU-bound work. A caller of Yield whose turn is due joins a
// queue. A driver goroutine parks on a pipe the network poller watches, into which a goroutine of its own writes
// the turn's byte: a goroutine parked on a file descriptor is woken only by a poll (or its deadline), so the
// driver runs again after the next poll, which comes once the goroutines ahead of it have run, or at once on
// an idle P. Then it lets the longest waiting callers go on, one for each P, and waits for the next poll. So
// while turns end at polls, one slice of such work runs on a P between two polls however many bodies are under
// way: when every waiting caller went on at each poll, the network waited a slice per body (RELIABILITY.md).
// A turn that lapses, or a broken pipe, lets every waiting caller go on.
type Turns struct {
	every  time.Duration
	epoch  time.Time
	next   atomic.Int64 // when a turn is due next, in nanoseconds since epoch
	broken atomic.Bool  // the pipe failed: Yield only yields the processor
	polled atomic.Int64 // turns that ended at a poll and let callers go
	lapsed atomic.Int64 // turns that ended at maxTurn, or on a broken pipe, and let callers go

	mu      sync.Mutex
	waiting []chan struct{} // the callers waiting for their turn, longest first
	driving bool            // a driver is under way
	onStop  func()          // tests' hook: called once when the driver next stops

	// The driver's alone: one at a time.
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

// Taken reports how many turns that let callers go ended at a poll and how many at maxTurn (or on a broken
// pipe): what tests and benchmarks check.
func (t *Turns) Taken() (polled, lapsed int64) { return t.polled.Load(), t.lapsed.Load() }

// Yield is called between slices of CPU-bound work: it lets the goroutines waiting for the processor run and,
// when a turn is due, waits for its turn: the callers ahead of it go on one per P at each poll of the network
// (every one at a lapse), and then it does.
func (t *Turns) Yield() {
	if t.broken.Load() || !t.due() {
		runtime.Gosched()
		return
	}
	c := wakeups.Get().(chan struct{})
	t.mu.Lock()
	t.waiting = append(t.waiting, c)
	if !t.driving {
		t.driving = true
		go t.drive()
	}
	t.mu.Unlock()
	<-c
	wakeups.Put(c)
}

// wakeups are the channels a caller waits on for its turn: each holds room for the one send that lets it go,
// and goes back to the pool once received from.
var wakeups = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

// drive ends turns while callers wait, and stops at the first turn that ends with none waiting.
func (t *Turns) drive() {
	for {
		polled := t.waitForPoll()
		if polled {
			// The poll readied the driver among the goroutines it found, maybe first: they run before the caller
			// let go queues ahead of them. (The next turn's go t.ring, which takes the front of the run queue
			// and so moves that caller behind them, does so too today; this does not rest on it.)
			runtime.Gosched()
		}
		onStop, more := t.endTurn(polled && !t.broken.Load())
		if !more {
			if onStop != nil {
				onStop()
			}
			return
		}
	}
}

// endTurn lets callers go: after a poll the longest waiting, one for each P; after a lapse, or once the pipe
// has failed, every one, since parking them has not brought the poll nearer. more is false when none waits,
// and the driver stops (calling onStop, a test's hook, when set).
func (t *Turns) endTurn(polled bool) (onStop func(), more bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.waiting) == 0 {
		t.driving = false
		onStop, t.onStop = t.onStop, nil
		return onStop, false
	}
	n := len(t.waiting)
	if polled {
		n = min(n, runtime.GOMAXPROCS(0))
		t.polled.Add(1)
	} else {
		t.lapsed.Add(1)
	}
	for _, c := range t.waiting[:n] {
		c <- struct{}{}
	}
	t.waiting = slices.Delete(t.waiting, 0, n)
	t.next.Store(int64(time.Since(t.epoch) + t.every))
	return nil, true
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
			return false
		}
		if err != nil {
			t.broken.Store(true)
			return false
		}
		if bytes.IndexByte(t.buf[:n], t.seq) >= 0 { // its own byte, among earlier turns' late ones
			return true
		}
	}
}

// ring writes a turn's byte. It runs after the driver has parked (or, on another P, before: the turn then ends
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
