package audit

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/test/wait"
)

func TestOutMode(t *testing.T) {
	var out bytes.Buffer
	l := mustNew(t, Options{Out: &out})
	paris := time.FixedZone("CET", 3600)
	l.Write(Record{
		Time: time.Date(2026, 12, 1, 11, 30, 0, 5, paris), RequestID: "r1", TraceID: "t1", Tenant: "acme",
		Tier: "gold", Model: "m", Pool: "p", Endpoint: "10.0.0.1:8000", PromptDigest: "aa", OutputDigest: "bb",
		PromptTokens: 10, CachedTokens: 4, CompletionTokens: 3, CostUSD: 0.5, TTFTMillis: 12.5, E2EMillis: 40,
		Status: 200, Outcome: "ok", Good: true,
	})
	l.Write(Record{Time: t0, RequestID: "r2", Tenant: "../other", Model: "m", Outcome: "error", CostUSD: math.NaN()})
	l.Write(rec("acme", 3))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(out.String(), "\n")
	want := []string{
		`{"time":"2026-12-01T10:30:00.000000005Z","request_id":"r1","trace_id":"t1","tenant":"acme","tier":"gold",` +
			`"model":"m","pool":"p","endpoint":"10.0.0.1:8000","prompt_hmac":"aa","output_hmac":"bb",` +
			`"prompt_tokens":10,"cached_tokens":4,"completion_tokens":3,"cost_usd":0.5,"ttft_ms":12.5,"e2e_ms":40,` +
			`"status":200,"outcome":"ok","good":true}` + "\n",
		`{"time":"2026-12-01T10:30:00.123Z","request_id":"r2","tenant":"../other","model":"m","prompt_tokens":0,` +
			`"cached_tokens":0,"completion_tokens":0,"cost_usd":0,"ttft_ms":0,"e2e_ms":0,"outcome":"error","good":false}` + "\n",
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d:\n got %s\nwant %s", i, lines[i], w)
		}
	}
	if got := parseLines(t, out.Bytes()); len(got) != 3 || got[2] != rec("acme", 3) {
		t.Fatalf("got %d records, last %+v", len(got), got[len(got)-1])
	}
	if got := testutil.ToFloat64(l.m.lines); got != 3 {
		t.Fatalf("lines_total = %v, want 3", got)
	}
}

func TestZeroTimeIsNow(t *testing.T) {
	var out bytes.Buffer
	clk := newClock(t0.In(time.FixedZone("X", -7200)))
	l := mustNew(t, Options{Out: &out, Now: clk.now})
	l.Write(Record{Tenant: "a", Outcome: "ok"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), `{"time":"2026-12-01T10:30:00.123Z",`) {
		t.Fatalf("got %s", out.String())
	}
}

// TestWriteNeverBlocks stalls the writer goroutine inside Out, fills the buffer and checks that more Writes
// return at once and are counted as dropped, and that the buffered lines are written once Out recovers.
func TestWriteNeverBlocks(t *testing.T) {
	const buffer, extra = 4, 10
	out := newBlockingWriter()
	reg := prometheus.NewRegistry()
	l := mustNew(t, Options{Out: out, Buffer: buffer, Registerer: reg})

	l.Write(rec("a", 0))
	select { // the writer has taken line 0 and is stuck flushing it
	case <-out.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("writer never reached Out")
	}
	within(t, "Write with a stuck writer", func() {
		for i := 1; i <= buffer+extra; i++ {
			l.Write(rec("a", i))
		}
	})
	if got := l.Dropped(); got != extra {
		t.Fatalf("Dropped() = %d, want %d", got, extra)
	}
	if got := testutil.ToFloat64(l.m.dropped); got != extra {
		t.Fatalf("infergate_audit_dropped_total = %v, want %d", got, extra)
	}

	close(out.release)
	within(t, "Close", func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	got := parseLines(t, out.bytes())
	if len(got) != 1+buffer {
		t.Fatalf("%d lines written, want %d", len(got), 1+buffer)
	}
	for i, r := range got {
		if r != rec("a", i) {
			t.Fatalf("line %d is %+v", i, r)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "infergate_audit_lines_total", "infergate_audit_dropped_total",
		"infergate_audit_write_errors_total"); err != nil || n != 3 {
		t.Fatalf("gathered %d metrics (%v), want 3", n, err)
	}
	if got := testutil.ToFloat64(l.m.lines); got != 1+buffer {
		t.Fatalf("infergate_audit_lines_total = %v, want %d", got, 1+buffer)
	}
}

// TestWriteAllocs checks Write costs the caller no allocation, whether the line is queued or dropped. The
// writer is held stuck so its own allocations do not show up in the count.
func TestWriteAllocs(t *testing.T) {
	out := newBlockingWriter()
	l := mustNew(t, Options{Out: out, Buffer: 50})
	defer close(out.release)
	l.Write(rec("a", 0))
	<-out.entered
	r := rec("a", 1)
	if n := testing.AllocsPerRun(200, func() { l.Write(r) }); n != 0 {
		t.Fatalf("Write allocates %v times per call", n)
	}
	if l.Dropped() == 0 {
		t.Fatal("the buffer never filled: the dropping path was not measured")
	}
}

func TestWriteAfterClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts func(t *testing.T) Options
	}{
		{"out", func(*testing.T) Options { return Options{Out: &bytes.Buffer{}} }},
		{"dir", func(t *testing.T) Options { return Options{Dir: t.TempDir()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustNew(t, tc.opts(t))
			l.Write(rec("a", 0))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				l.Write(rec("a", i))
			}
			if got := l.Dropped(); got != 3 {
				t.Fatalf("Dropped() = %d, want 3", got)
			}
			if got := testutil.ToFloat64(l.m.dropped); got != 3 {
				t.Fatalf("dropped_total = %v, want 3", got)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// TestConcurrentWriteClose races Writes against Close: every line is either written or counted as dropped.
func TestConcurrentWriteClose(t *testing.T) {
	var out bytes.Buffer
	l := mustNew(t, Options{Out: &out, Buffer: 8})
	const writers, each = 4, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Write(rec("a", w*each+i))
			}
		})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	written := len(parseLines(t, out.Bytes()))
	if uint64(written)+l.Dropped() != writers*each {
		t.Fatalf("%d written + %d dropped != %d", written, l.Dropped(), writers*each)
	}
}

// countingHandler counts log records and keeps their text.
type countingHandler struct {
	mu    sync.Mutex
	n     int
	text  strings.Builder
	level slog.Level
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	h.level = r.Level
	h.text.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { h.text.WriteString(" " + a.String()); return true })
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestWriteErrorsCountedAndRateLimited(t *testing.T) {
	h := &countingHandler{}
	l := mustNew(t, Options{Out: failingWriter{}, Logger: slog.New(h)})
	const n = 5
	for i := range n {
		r := rec("a", i)
		r.PromptDigest = "feedface"
		l.Write(r)
		wait.For(t, "the write error", func() bool { return testutil.ToFloat64(l.m.errors) >= float64(i+1) })
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(l.m.lines); got != 0 {
		t.Fatalf("lines_total = %v, want 0: no flush succeeded", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n != 1 || h.level != slog.LevelWarn {
		t.Fatalf("%d log records at %v, want 1 at WARN: %s", h.n, h.level, h.text.String())
	}
	if s := h.text.String(); !strings.Contains(s, "disk full") || strings.Contains(s, "feedface") || strings.Contains(s, "req-") {
		t.Fatalf("log record %q: want the error and no record contents", s)
	}
}

func TestNewErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	mustNew(t, Options{Out: &bytes.Buffer{}, Registerer: reg})
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"no sink", Options{}},
		{"negative size", Options{Out: &bytes.Buffer{}, MaxFileBytes: -1}},
		{"negative buffer", Options{Out: &bytes.Buffer{}, Buffer: -1}},
		{"registered twice", Options{Out: &bytes.Buffer{}, Registerer: reg}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if l, err := New(tc.o); err == nil {
				_ = l.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}
