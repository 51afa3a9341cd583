package audit

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// warnEvery is the least time between two warnings: a full disk fails every line, and the log must not
// become a second flood.
const warnEvery = 10 * time.Second

// metrics counts what became of the lines handed to Write.
type metrics struct {
	lines   prometheus.Counter // flushed to a file or Out
	dropped prometheus.Counter // buffer full, or Write after Close
	errors  prometheus.Counter // encoding, opening, writing, flushing, rotating or closing failed
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		lines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_audit_lines_total", Help: "Audit lines written (flushed to a file or Out).",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_audit_dropped_total",
			Help: "Audit lines dropped without being written: the writer's buffer was full, or the log was closed.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "infergate_audit_write_errors_total",
			Help: "Audit log errors: encoding, opening, writing, flushing, rotating or closing a file.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.lines, m.dropped, m.errors} {
		if err := reg.Register(c); err != nil {
			return metrics{}, fmt.Errorf("audit: register metrics: %w", err)
		}
	}
	return m, nil
}

// warner logs errors at warn level, at most one per warnEvery; the next one logged says how many were
// suppressed. Messages carry the error only, never a record's contents.
type warner struct {
	log        *slog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (w *warner) warn(msg string, err error) {
	w.mu.Lock()
	now := time.Now()
	if !w.last.IsZero() && now.Sub(w.last) < warnEvery {
		w.suppressed++
		w.mu.Unlock()
		return
	}
	n := w.suppressed
	w.last, w.suppressed = now, 0
	w.mu.Unlock()
	w.log.Warn(msg, "err", err, "suppressed", n)
}
