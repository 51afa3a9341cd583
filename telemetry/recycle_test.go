package telemetry

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
)

// copier keeps copies of what it is handed, as an OTLP exporter's protobuf does.
type copier struct {
	mu     sync.Mutex
	attrs  [][]attribute.KeyValue
	events []int
}

func (c *copier) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range spans {
		c.attrs = append(c.attrs, append([]attribute.KeyValue(nil), s.Attributes()...))
		c.events = append(c.events, len(s.Events()))
	}
	return nil
}

func (*copier) Shutdown(context.Context) error { return nil }

// endMany records n routed requests' spans, request i with the id "r<i>", then flushes them.
func endMany(t *testing.T, tr *Tracing, n int) {
	t.Helper()
	started := time.Unix(5000, 0)
	for i := range n {
		r := tr.Begin("", "", "", openai.EndpointChat, started)
		r.End(director.Settlement{Routed: true, Model: "m", Operation: openai.EndpointChat, Outcome: director.OutcomeOK,
			RequestID: fmt.Sprintf("r%d", i), Endpoint: "10.0.0.1:8000", Status: 200},
			Marks{Routed: started.Add(time.Millisecond), FirstToken: started.Add(2 * time.Millisecond), Ended: started.Add(time.Second)})
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func requestID(attrs []attribute.KeyValue) string {
	for _, a := range attrs {
		if a.Key == "infergate.request_id" {
			return a.Value.AsString()
		}
	}
	return ""
}

func TestRecycledSpansReachTheExporterWhole(t *testing.T) {
	c := &copier{}
	tr := NewTracing(ExportCopies(c), sdktrace.AlwaysSample(), nil)
	if !tr.recycle {
		t.Fatal("a declared exporter's spans are not recycled")
	}
	const n = 1000 // several export batches, so storage is reused between them
	endMany(t, tr, n)
	if len(c.attrs) != n {
		t.Fatalf("%d spans exported, want %d", len(c.attrs), n)
	}
	seen := make(map[string]bool, n)
	for i, attrs := range c.attrs {
		id := requestID(attrs)
		if id == "" || seen[id] || len(attrs) != len(c.attrs[0]) || c.events[i] != 2 {
			t.Fatalf("span %d: request id %q (seen before: %v), %d attributes, %d events", i, id, seen[id], len(attrs), c.events[i])
		}
		seen[id] = true
	}
	arr := attrArrays.Get().(*attrArray)
	for i, a := range arr {
		if a.Key != "" {
			t.Fatalf("pooled attribute storage still holds %v at %d", a, i)
		}
	}
}

func TestUndeclaredExportersKeepTheirSpans(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tr := NewTracing(keep{mem}, sdktrace.AlwaysSample(), nil)
	if tr.recycle {
		t.Fatal("an exporter that keeps spans has them recycled")
	}
	const n = 600
	endMany(t, tr, n)
	spans := mem.GetSpans()
	if len(spans) != n {
		t.Fatalf("%d spans, want %d", len(spans), n)
	}
	for i, s := range spans {
		if got, want := requestID(s.Attributes), fmt.Sprintf("r%d", i); got != want {
			t.Fatalf("span %d has request id %q, want %q: its storage was reused", i, got, want)
		}
	}
}
