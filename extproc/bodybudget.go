package extproc

import "sync/atomic"

// bodyBudget counts the request-body bytes the process holds for requests it has not routed yet. Each body
// is parsed in place (openai/scan.go), so what a body costs is its bytes; the budget bounds their sum, so
// that many large bodies arriving faster than they are routed cannot grow the process past its memory
// limit. A body that does not fit is refused as it arrives (503 with retry-after), before it is parsed.
// Large bodies may fill only three quarters of it: a flood of them leaves room for ordinary requests.
type bodyBudget struct{ held atomic.Int64 }

// largeBodyBytes is the size past which a body counts as large.
const largeBodyBytes = 64 << 10

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
