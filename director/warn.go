package director

import (
	"log/slog"
	"sync"
	"time"
)

// upstreamWarnings logs failed responses at warn — they are what an operator looks for first — but at most
// burst lines per second, so a failing pool cannot flood the log; the next line says how many were left out.
type upstreamWarnings struct {
	mu         sync.Mutex
	now        func() time.Time
	burst      int
	window     time.Time
	used       int
	suppressed int
}

const upstreamWarnBurst = 10

func (w *upstreamWarnings) log(l *slog.Logger, st Settlement) {
	switch st.Outcome {
	case OutcomeUpstream5xx, OutcomeReset, OutcomeTimeout:
	default:
		return
	}
	w.mu.Lock()
	now := w.now()
	if now.Sub(w.window) >= time.Second {
		w.window, w.used = now, 0
	}
	if w.used >= w.burst {
		w.suppressed++
		w.mu.Unlock()
		return
	}
	w.used++
	suppressed := w.suppressed
	w.suppressed = 0
	w.mu.Unlock()
	l.Warn("upstream request failed", "request_id", st.RequestID, "outcome", st.Outcome, "status", st.Status,
		"endpoint", st.Endpoint, "pool", st.Pool, "model", st.Model, "tenant", st.Tenant,
		"elapsed_ms", st.Timing.E2E.Milliseconds(), "suppressed_since_last", suppressed)
}
