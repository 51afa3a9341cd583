// Package audit is the platform's record of who used what: one JSON line per settled request (tenant, model,
// pool, tokens, cost, latency, outcome), with SHA-256 digests in place of the prompt and output text and never
// a key. Billing disputes, abuse reviews and capacity questions are answered from it without the gateway
// keeping what anyone said.
//
// Writing it must never slow a request, so Write only hands the record to one writer goroutine through a
// bounded buffer and, when the buffer is full, drops the line and counts it (infergate_audit_dropped_total).
// The writer encodes, appends to per-tenant files (or one io.Writer such as stdout), rotates files by size and
// deletes rotated files past their tenant's retention.
package audit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// drainEvery bounds how long a line waits between Write and the file.
// Short, so that each drain is small: a batch written while a request is being decided competes with it for a
// core, and many small batches touch the tail of decision latency less than a few large ones.
const drainEvery = 10 * time.Millisecond

// initialQueue is the queues' starting capacity: ten milliseconds of a busy gateway's requests.
const initialQueue = 256

const (
	defaultMaxFileBytes = 64 << 20
	defaultBuffer       = 4096
	defaultSweepEvery   = time.Minute
)

// Options configure a Log. Either Dir or Out must be set.
type Options struct {
	// Dir, when set, is the folder of per-tenant files: Dir/<tenant>/current.jsonl, rotated to
	// Dir/<tenant>/<UTC time of rotation, e.g. 20261201T103000.123Z>.jsonl when it would exceed MaxFileBytes.
	// A tenant name that is not ^[a-z0-9._-]{1,128}$ (or is "." or "..") gets the directory "x+" followed by
	// 32 hex digits of its SHA-256. Directories are created 0o750, files 0o640.
	Dir string
	// Out is the sink when Dir is "" (e.g. os.Stdout); it is ignored when Dir is set. The Log never closes it.
	Out io.Writer
	// MaxFileBytes is the size a tenant's current.jsonl is rotated at; default 64 MiB.
	MaxFileBytes int64
	// Retention says how long a tenant's rotated files are kept (0: forever); called with the tenant's name,
	// or "" for a directory whose tenant is unknown (see Sweep). Nil keeps every file.
	Retention func(tenant string) time.Duration
	// Buffer is how many lines are held for the writer goroutine; default 4096.
	Buffer int
	// Now is the clock for records' zero Time, rotation names and Sweep; default time.Now.
	Now func() time.Time
	// SweepEvery is how often the writer deletes expired files, default 1 min; negative turns the periodic
	// sweep off (Sweep can still be called).
	SweepEvery time.Duration
	// Registerer, when non-nil, gets the log's counters.
	Registerer prometheus.Registerer
	// Logger gets write errors at warn level, at most one per 10 s; nil discards them.
	Logger *slog.Logger
}

// Log is an audit log. Write may be called from any goroutine; one writer goroutine does all the I/O.
type Log struct {
	// The queue: Write appends under qmu, the writer goroutine swaps it for an empty one every drainEvery (or
	// when it is half full), so a Write wakes no goroutine — on a busy gateway a wake-up per request would cost
	// a futex call on the request path and a goroutine competing for a core.
	qmu    sync.Mutex
	queue  []Record
	spare  []Record
	limit  int
	closed bool
	kick   chan struct{} // a half-full queue asks the writer to drain now
	stop   chan struct{} // closed by Close

	done      chan struct{} // closed when the writer goroutine has returned
	closeOnce sync.Once
	closeErr  error // set by the writer goroutine before done is closed

	now        func() time.Time
	dir        string
	retention  func(string) time.Duration
	sweepEvery time.Duration
	sink       sink

	// line is the writer goroutine's buffer, reused for every line.
	line []byte

	sweepMu sync.Mutex        // one Sweep at a time
	namesMu sync.Mutex        // guards names
	names   map[string]string // directory name → tenant name, for the tenants whose file was opened

	dropped atomic.Uint64
	m       metrics
	warn    warner
}

// New checks o, creates Dir when set, registers the metrics and starts the writer goroutine. Close stops it.
func New(o Options) (*Log, error) {
	return newLog(o, maxOpenFiles)
}

func newLog(o Options, maxOpen int) (*Log, error) {
	switch {
	case o.Dir == "" && o.Out == nil:
		return nil, errors.New("audit: neither Dir nor Out is set")
	case o.MaxFileBytes < 0:
		return nil, fmt.Errorf("audit: MaxFileBytes %d is negative", o.MaxFileBytes)
	case o.Buffer < 0:
		return nil, fmt.Errorf("audit: Buffer %d is negative", o.Buffer)
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = defaultMaxFileBytes
	}
	if o.Buffer == 0 {
		o.Buffer = defaultBuffer
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SweepEvery == 0 {
		o.SweepEvery = defaultSweepEvery
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Dir != "" {
		if err := os.MkdirAll(o.Dir, dirPerm); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	l := &Log{
		// The queues grow to what a drain interval brings (Write appends up to limit): a full-size array of
		// Records would be scanned by every garbage collection, lines in it or not.
		queue:      make([]Record, 0, min(o.Buffer, initialQueue)),
		spare:      make([]Record, 0, min(o.Buffer, initialQueue)),
		limit:      o.Buffer,
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		now:        o.Now,
		dir:        o.Dir,
		retention:  o.Retention,
		sweepEvery: o.SweepEvery,
		names:      make(map[string]string),
		m:          m,
		warn:       warner{log: o.Logger},
	}
	if o.Dir != "" {
		l.sink = newDirSink(o.Dir, o.MaxFileBytes, maxOpen, o.Now, l)
	} else {
		l.sink = newOutSink(o.Out, l.written)
	}
	go l.run()
	return l, nil
}

// Write hands r to the writer goroutine. It never blocks on I/O: when the buffer is full, or after Close, the
// line is dropped and counted (Dropped, infergate_audit_dropped_total). A zero r.Time is set to Now().
func (l *Log) Write(r Record) {
	if r.Time.IsZero() {
		r.Time = l.now()
	}
	l.qmu.Lock()
	if !l.closed && len(l.queue) < l.limit {
		l.queue = append(l.queue, r)
		if len(l.queue) == l.limit/2+1 {
			select {
			case l.kick <- struct{}{}:
			default:
			}
		}
		l.qmu.Unlock()
		return
	}
	l.qmu.Unlock()
	l.dropped.Add(1)
	l.m.dropped.Inc()
}

// Dropped is how many lines Write has dropped so far.
func (l *Log) Dropped() uint64 { return l.dropped.Load() }

// Close stops taking lines, waits for the writer goroutine to write the ones buffered, then flushes and
// closes the files. It waits as long as the writer does, so a stuck Out holds it up. Later calls return the
// first call's result.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.qmu.Lock()
		l.closed = true
		l.qmu.Unlock()
		close(l.stop)
		<-l.done
	})
	return l.closeErr
}

// run is the writer goroutine: it writes lines as they come, flushes whenever it has caught up, and sweeps
// every SweepEvery.
func (l *Log) run() {
	defer close(l.done)
	var tick <-chan time.Time
	if l.dir != "" && l.retention != nil && l.sweepEvery > 0 {
		t := time.NewTicker(l.sweepEvery)
		defer t.Stop()
		tick = t.C
	}
	drain := time.NewTicker(drainEvery)
	defer drain.Stop()
	for {
		select {
		case <-l.stop:
			l.drain() // Write takes nothing once closed: this is the last of it
			if err := l.sink.close(); err != nil {
				l.fail(err)
				l.closeErr = err
			}
			return
		case <-drain.C:
			l.drain()
		case <-l.kick:
			l.drain()
		case <-tick:
			if _, err := l.Sweep(); err != nil {
				l.warn.warn("audit: sweep failed", err)
			}
		}
	}
}

// yieldEvery is how many lines drain encodes before it lets other goroutines run.
const yieldEvery = 16

// drain writes and flushes every queued line: a reader sees a line within drainEvery of its Write, and a busy
// gateway makes one write per batch rather than one per request.
func (l *Log) drain() {
	l.qmu.Lock()
	batch := l.queue
	l.queue, l.spare = l.spare[:0], nil
	l.qmu.Unlock()
	if len(batch) == 0 {
		l.qmu.Lock()
		l.spare = batch
		l.qmu.Unlock()
		return
	}
	for i := range batch {
		l.writeLine(&batch[i])
		batch[i] = Record{} // hold no strings past their line
		if i%yieldEvery == yieldEvery-1 {
			runtime.Gosched() // a long batch does not hold a core a request is waiting for
		}
	}
	if err := l.sink.flush(); err != nil {
		l.fail(err)
	}
	l.qmu.Lock()
	l.spare = batch[:0]
	l.qmu.Unlock()
}

// writeLine encodes r into the reused buffer and hands the line to the sink.
func (l *Log) writeLine(r *Record) {
	r.CostUSD = finite(r.CostUSD)
	r.TTFTMillis = finite(r.TTFTMillis)
	r.E2EMillis = finite(r.E2EMillis)
	l.line = appendLine(l.line[:0], r)
	if err := l.sink.write(r.Tenant, l.line); err != nil {
		l.fail(err)
	}
}

// written counts n lines the sink has flushed.
func (l *Log) written(n int) { l.m.lines.Add(float64(n)) }

// fail counts an error and warns about it (rate-limited).
func (l *Log) fail(err error) {
	l.m.errors.Inc()
	l.warn.warn("audit: write failed", err)
}

// finite maps NaN and ±Inf, which JSON cannot carry, to 0.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
