package extproc

import "sync/atomic"

// bodyBudget counts the request-body bytes the process holds for requests it has not routed yet. Each body
// is parsed in place (openai/scan.go), so what a body costs is its bytes; the budget bounds their sum, so
// that many large bodies arriving faster than they are routed cannot grow the process past its memory
// limit. A body that does not fit is refused as it arrives (503 with retry-after), before it is parsed.
type bodyBudget struct{ held atomic.Int64 }

// take reserves n bytes if the bodies held stay within limit.
func (b *bodyBudget) take(n, limit int64) bool {
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
