package extproc

import (
	"context"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/infergate/infergate/openai"
)

// bodyBudget counts the request-body bytes the process holds for requests it has not routed yet. Each body
// is parsed in place (openai/scan.go), so what a body costs is its bytes; the budget bounds their sum, so
// that many large bodies arriving faster than they are routed cannot grow the process past its memory
// limit. A body that does not fit is refused as it arrives (503 with retry-after), before it is parsed.
// Large bodies may fill only three quarters of it: a flood of them leaves room for ordinary requests.
type bodyBudget struct{ held atomic.Int64 }

// largeBodyBytes is the size past which a body counts as large: the parser's, past which its scan gives way.
const largeBodyBytes = openai.LargeBodyBytes

// take reserves n more bytes for a body that will then hold total, if the bodies held stay within limit
// (three quarters of it for a large body).
func (b *bodyBudget) take(n, total, limit int64) bool {
	if total > largeBodyBytes {
		limit -= limit / 4
	}
	for {
		cur := b.held.Load()
		if cur+n > limit {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// give returns n bytes.
func (b *bodyBudget) give(n int64) { b.held.Add(-n) }

// receiveGate holds back the bodies of large BUFFERED requests until there is room to take them: after their
// headers are answered, their stream is not read until the gate admits their declared length, so the bytes
// wait in Envoy (gRPC flow control stops it at one window per stream) instead of in this process, and the
// large bodies being received and parsed at once are few enough to leave the CPU to ordinary requests. An
// admission lapses if its body has not arrived within the wait a body is allowed: a client that trickles its
// body into Envoy holds the gate no longer than that.
type receiveGate struct {
	sem      *semaphore.Weighted
	capacity int64
	admitted *atomic.Int64 // bytes admitted now
}

func newReceiveGate(capacity int64) receiveGate {
	return receiveGate{sem: semaphore.NewWeighted(capacity), capacity: capacity, admitted: &atomic.Int64{}}
}

// wait admits n bytes (at most the gate's capacity, which a body larger than that takes whole) within timeout
// (0: until ctx ends), and returns what it admitted: 0 when it did not.
func (g receiveGate) wait(ctx context.Context, n int64, timeout time.Duration) int64 {
	n = min(n, g.capacity)
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if g.sem.Acquire(ctx, n) != nil {
		return 0
	}
	g.admitted.Add(n)
	return n
}

// admission is bytes the gate admitted, given back once: when the body has been handled, or when it lapses.
type admission struct {
	gate  receiveGate
	n     int64
	given atomic.Bool
	lapse *time.Timer
}

// admit waits for n bytes as wait does and returns the admission, nil when there was none; it lapses after
// lapse (0: never).
func (g receiveGate) admit(ctx context.Context, n int64, timeout, lapse time.Duration) *admission {
	got := g.wait(ctx, n, timeout)
	if got == 0 {
		return nil
	}
	a := &admission{gate: g, n: got}
	if lapse > 0 {
		a.lapse = time.AfterFunc(lapse, a.giveBack)
	}
	return a
}

// arrived stops the lapse: the body is here, and holds its admission until it is handled.
func (a *admission) arrived() {
	if a != nil && a.lapse != nil {
		a.lapse.Stop()
	}
}

// giveBack returns the bytes, once.
func (a *admission) giveBack() {
	if a != nil && a.given.CompareAndSwap(false, true) {
		a.gate.admitted.Add(-a.n)
		a.gate.sem.Release(a.n)
	}
}
