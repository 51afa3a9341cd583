package netturn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTurnsLetTheNetworkIn runs CPU-bound workers on one P, yielding between slices of work, while two
// goroutines play ping-pong over loopback TCP, and counts the round trips that complete before the workers
// finish. With runtime.Gosched the run queue never empties, so each read waits for sysmon's poll (up to 10 ms);
// with turns the network is polled every Every of work. The same work is done in both modes.
func TestTurnsLetTheNetworkIn(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	turns, err := New(Every)
	if err != nil {
		t.Fatal(err)
	}
	defer turns.Close()
	gosched := roundTripsDuringWork(t, runtime.Gosched)
	withTurns := roundTripsDuringWork(t, turns.Yield)
	polled, lapsed := turns.Taken()
	t.Logf("round trips during the same work: %d with Gosched, %d with turns (%d turns, %d lapsed)", gosched, withTurns, polled, lapsed)
	if polled == 0 {
		t.Fatal("no turn ended at a poll")
	}
	if withTurns < 4*max(gosched, 5) {
		t.Fatalf("round trips during the work: %d with turns, %d with Gosched: want at least 4× as many (and 20)", withTurns, gosched)
	}
}

// roundTripsDuringWork runs four workers, each 1,500 slices of busy work with yield between them, and returns
// how many ping-pong round trips over loopback finished meanwhile.
func roundTripsDuringWork(t *testing.T, yield func()) int64 {
	t.Helper()
	client, server := tcpPair(t)
	var trips atomic.Int64
	var done atomic.Bool
	var pingers sync.WaitGroup
	pingers.Go(func() { echo(server) })
	pingers.Go(func() {
		buf := make([]byte, 1)
		for !done.Load() {
			if _, err := client.Write(buf); err != nil {
				return
			}
			if _, err := io.ReadFull(client, buf); err != nil {
				return
			}
			trips.Add(1)
		}
	})
	var workers sync.WaitGroup
	for range 4 {
		workers.Go(func() {
			x := uint64(1)
			for range 1500 {
				x = busy(x)
				yield()
			}
			sink.Add(x)
		})
	}
	workers.Wait()
	n := trips.Load()
	done.Store(true)
	client.Close()
	server.Close()
	pingers.Wait()
	return n
}

// echo writes back every byte it reads until the connection closes.
func echo(c net.Conn) {
	buf := make([]byte, 1)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := lis.Accept()
		accepted <- c
	}()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	return client, server
}

// sink keeps the workers' results, so that their work is not optimised away.
var sink atomic.Uint64

// busy is a slice of CPU-bound work, some tens of microseconds.
func busy(x uint64) uint64 {
	for i := range 20000 {
		x = x*6364136223846793005 + uint64(i)
	}
	return x
}

// TestEveryYieldTakesATurnWhenDue: with every 0 each Yield is a turn, which a poll ends although nothing but the
// pipe is on the network.
func TestEveryYieldTakesATurnWhenDue(t *testing.T) {
	turns := newTurns(t, 0)
	for range 100 {
		turns.Yield()
	}
	// A turn lapses only when the process was not scheduled for maxTurn: allow a busy machine a few.
	if polled, lapsed := turns.Taken(); polled+lapsed != 100 || polled < 90 {
		t.Fatalf("turns: %d ended at a poll, %d lapsed; want 100, nearly all at a poll", polled, lapsed)
	}
	if turns.broken.Load() {
		t.Fatal("the pipe failed")
	}
}

// TestEachCallerWaitsForAPollOfItsOwn: on one P, callers that yield while others wait for their turn queue, and
// each turn lets one go on, so a poll comes between any two slices of their work however many are under way.
// Every call returns, though the callers stop yielding at different times (the driver stops when none waits).
// When a turn let every waiting caller go, as before, 16 callers shared about one turn in 16.
func TestEachCallerWaitsForAPollOfItsOwn(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	turns := newTurns(t, 0)
	var wg sync.WaitGroup
	calls := 0
	for i := range 16 {
		n := 20 * (i + 1)
		calls += n
		wg.Go(func() {
			for range n {
				turns.Yield()
			}
		})
	}
	wg.Wait()
	polled, lapsed := turns.Taken()
	// A lapse (the process not scheduled for maxTurn) lets every waiting caller go, up to 16: allow the busy
	// machine a few, each of which can hide no more than that.
	if lapsed > 20 {
		t.Skipf("%d turns lapsed: the machine did not schedule this process for 2 ms that often", lapsed)
	}
	if polled < int64(calls)-16*lapsed {
		t.Fatalf("%d turns at a poll and %d lapsed for %d calls: want a turn at a poll for every call but a lapse's", polled, lapsed, calls)
	}
	waitUntilIdle(turns)
}

// TestCallersTakeTurnsInOrder: on one P, three callers yielding in a loop go on in the order they queued,
// round after round, so a large body's work is not starved by others'.
func TestCallersTakeTurnsInOrder(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	turns := newTurns(t, 0)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			for range 100 {
				turns.Yield()
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// An overtake: a caller goes on again before both others have had their go since its last. A lapse lets
	// every waiting caller go on at once, in whatever order the scheduler runs them (the race detector shuffles
	// it): allow two per lapse.
	done := [3]int{}
	overtakes := 0
	for k, i := range order {
		if k >= 2 && max(done[0], done[1], done[2]) < 100 && (order[k-1] == i || order[k-2] == i) {
			overtakes++
		}
		done[i]++
	}
	if _, lapsed := turns.Taken(); overtakes > 2*int(lapsed) {
		t.Fatalf("a caller went on again before the others had theirs %d times (%d turns lapsed); order %v", overtakes, lapsed, order)
	}
}

// waitUntilIdle waits for the driver to stop: its last turn ends at the next poll, which comes as this
// goroutine parks, or lapses.
func waitUntilIdle(turns *Turns) {
	stopped := make(chan struct{})
	turns.mu.Lock()
	if !turns.driving {
		turns.mu.Unlock()
		return
	}
	turns.onStop = func() { close(stopped) }
	turns.mu.Unlock()
	<-stopped
}

// TestATurnLapsesWhileTheQueueIsFull: when other goroutines keep the one P busy, no poll comes and a turn ends
// at maxTurn, leaving its byte in the pipe. The next turn, once the queue empties, drops those bytes, waits for
// its own and leaves the pipe empty.
func TestATurnLapsesWhileTheQueueIsFull(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	turns := newTurns(t, 0)
	var stop atomic.Bool
	var busyWG sync.WaitGroup
	for range 2 {
		busyWG.Go(func() {
			x := uint64(1)
			for !stop.Load() {
				x = busy(x)
				runtime.Gosched()
			}
			sink.Add(x)
		})
	}
	for range 5 {
		turns.Yield()
	}
	stop.Store(true)
	busyWG.Wait()
	waitUntilIdle(turns) // the next Yield starts a driver and a turn of its own
	polledBusy, lapsed := turns.Taken()
	if lapsed == 0 {
		t.Fatalf("no turn lapsed while the queue was full (%d ended at a poll, sysmon's)", polledBusy)
	}
	turns.Yield()
	if polled, _ := turns.Taken(); polled != polledBusy+1 {
		t.Fatalf("the turn after the queue emptied did not end at a poll: %d, want %d", polled, polledBusy+1)
	}
	waitUntilIdle(turns) // the driver reads its last turn's byte, unless that turn lapsed too
	if err := turns.r.SetReadDeadline(time.Now().Add(5 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := turns.r.Read(buf)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	if err == nil && bytes.Count(buf[:n], []byte{turns.seq}) != n {
		t.Fatalf("the pipe still held %v (%v), not only the last turn's byte %d: the next turn would end without a poll", buf[:n], err, turns.seq)
	}
}

// TestWhatThePollFindsRunsFirst: on one P, a goroutine whose socket the turn's poll finds ready runs before the
// caller the turn lets go on with its work, although the poll readies the driver too, and maybe first. Rounds
// whose turn lapsed (the process not scheduled for maxTurn) say nothing; and Go's scheduler serves its global
// queue first one time in 61, so a few rounds go the other way. When the one who took the turn went on itself
// without yielding first, nearly every round did (3 of 200 the network's); the driver's yield, and its next
// turn's go t.ring, keep the order now.
func TestWhatThePollFindsRunsFirst(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	turns := newTurns(t, 0)
	client, server := tcpPair(t)
	const rounds, network, work = 200, 1, 2
	var polledRounds, networkFirst int
	for range rounds {
		var first atomic.Int32
		read := make(chan struct{})
		go func() {
			if _, err := io.ReadFull(server, make([]byte, 1)); err == nil {
				first.CompareAndSwap(0, network)
			}
			close(read)
		}()
		runtime.Gosched() // the reader parks on its socket
		if _, err := client.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		before, _ := turns.Taken()
		turns.Yield()
		first.CompareAndSwap(0, work)
		<-read
		if after, _ := turns.Taken(); after > before {
			polledRounds++
			if first.Load() == network {
				networkFirst++
			}
		}
	}
	t.Logf("the network first in %d of %d rounds whose turn ended at a poll (of %d)", networkFirst, polledRounds, rounds)
	if polledRounds < rounds/2 {
		// A machine that deschedules this process for 2 ms in most rounds tests nothing here; that turns end at
		// a poll is TestEveryYieldTakesATurnWhenDue's.
		t.Skipf("only %d of %d turns ended at a poll", polledRounds, rounds)
	}
	if networkFirst < polledRounds*4/5 {
		t.Fatalf("the network first in %d of %d rounds whose turn ended at a poll: want 80 %%", networkFirst, polledRounds)
	}
}

// TestClosedTurnsOnlyYield: after Close, Yield returns without a turn.
func TestClosedTurnsOnlyYield(t *testing.T) {
	turns, err := New(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := turns.Close(); err != nil {
		t.Fatal(err)
	}
	turns.Yield()
	if polled, lapsed := turns.Taken(); polled+lapsed != 0 {
		t.Fatalf("turns after Close: %d", polled+lapsed)
	}
}

func newTurns(t *testing.T, every time.Duration) *Turns {
	t.Helper()
	turns, err := New(every)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { turns.Close() })
	return turns
}

// BenchmarkYield is the cost of a Yield between turns (a clock read and Gosched).
func BenchmarkYield(b *testing.B) {
	turns, err := New(Every)
	if err != nil {
		b.Fatal(err)
	}
	defer turns.Close()
	turns.next.Store(int64(^uint64(0) >> 2)) // no turn is ever due
	for b.Loop() {
		turns.Yield()
	}
}

// BenchmarkTurn is the cost of a turn on an idle process: the pipe's write and read, the driver's wake-up and
// its hand-over to the caller.
func BenchmarkTurn(b *testing.B) {
	turns, err := New(0)
	if err != nil {
		b.Fatal(err)
	}
	defer turns.Close()
	for b.Loop() {
		turns.Yield()
	}
	polled, _ := turns.Taken()
	b.ReportMetric(float64(polled)/float64(b.N), "turns/op")
}
