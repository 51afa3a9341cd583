package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// t0 is the fake clock's start: rotations at it are named 20261201T103000.123Z.jsonl.
var t0 = time.Date(2026, 12, 1, 10, 30, 0, 123_000_000, time.UTC)

// clock is a settable Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// rec is a record for tenant whose encoded length does not depend on i for i < 10000.
func rec(tenant string, i int) Record {
	return Record{
		Time: t0, RequestID: "req-" + strconv.Itoa(10000 + i)[1:], Tenant: tenant, Model: "llama-3-70b",
		PromptTokens: 100, CompletionTokens: 20, CostUSD: 0.25, TTFTMillis: 120, E2EMillis: 900,
		Status: 200, Outcome: "ok", Good: true,
	}
}

// lineLen is the encoded length of rec(tenant, i), '\n' included.
func lineLen(t *testing.T, tenant string) int {
	t.Helper()
	b, err := json.Marshal(rec(tenant, 0))
	if err != nil {
		t.Fatal(err)
	}
	return len(b) + 1
}

// mustNew is New that fails the test on error and closes the log at the end of the test.
func mustNew(t *testing.T, o Options) *Log {
	t.Helper()
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// parseLines decodes JSON lines, failing on any line that does not parse or a missing final '\n'.
func parseLines(t *testing.T, data []byte) []Record {
	t.Helper()
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Fatalf("output does not end in a newline: %q", data)
	}
	var out []Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// readRecords parses a JSON-lines file.
func readRecords(t *testing.T, path string) []Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return parseLines(t, data)
}

// blockingWriter is an Out whose Write waits until release is closed, as a stuck disk or pipe would.
type blockingWriter struct {
	entered     chan struct{} // closed when the first Write begins
	release     chan struct{}
	enteredOnce sync.Once
	mu          sync.Mutex
	buf         bytes.Buffer
}

func newBlockingWriter() *blockingWriter {
	return &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.enteredOnce.Do(func() { close(w.entered) })
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *blockingWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// failingWriter is an Out whose every Write fails.
type failingWriter struct{}

var errDiskFull = errors.New("disk full")

func (failingWriter) Write([]byte) (int, error) { return 0, errDiskFull }

// within fails the test unless f returns within 10 s: it guards against a hang, it is not a timing assertion.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
	}
}
