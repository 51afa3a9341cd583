package telemetry

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// A traced request's span carries up to maxSpanAttrs attributes and two events; at 100 % sampling their storage
// is most of the bytes telemetry allocates per request, and garbage collection pays for every byte. When the
// exporter is known to be done with a batch once ExportSpans returns (the OTLP exporters turn it into protobuf
// first), that storage goes back to a pool instead.

// ExportCopies declares that exp has copied what it keeps of each span by the time its ExportSpans returns, as
// the OTLP exporters do, so NewTracing may reuse the spans' attribute and event storage afterwards. An exporter
// that keeps the spans themselves (such as tracetest.InMemoryExporter) must not be declared so.
func ExportCopies(exp sdktrace.SpanExporter) sdktrace.SpanExporter {
	return &recyclingExporter{SpanExporter: exp}
}

// spanEvents is how many events a span has at most: routed and first token.
const spanEvents = 2

type (
	attrArray  = [maxSpanAttrs]attribute.KeyValue
	eventArray = [spanEvents]sdktrace.Event
)

var (
	attrArrays  = sync.Pool{New: func() any { return new(attrArray) }}
	eventArrays = sync.Pool{New: func() any { return new(eventArray) }}
)

// recyclingExporter returns an exported batch's storage to the pools.
type recyclingExporter struct {
	sdktrace.SpanExporter
}

func (e *recyclingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	for _, s := range spans {
		recycleSpan(s)
	}
	return err
}

// recycleSpan puts a span's attribute and event arrays back. Only infergate's spans reach this exporter, and
// only they have storage of exactly these capacities (newAttrs, newEvents); anything else is left alone.
func recycleSpan(s sdktrace.ReadOnlySpan) {
	if attrs := s.Attributes(); cap(attrs) == maxSpanAttrs {
		arr := (*attrArray)(attrs[:maxSpanAttrs])
		clear(arr[:]) // hold no strings while pooled
		attrArrays.Put(arr)
	}
	if events := s.Events(); cap(events) == spanEvents {
		arr := (*eventArray)(events[:spanEvents])
		clear(arr[:])
		eventArrays.Put(arr)
	}
}

// newAttrs is an empty attribute slice for a span with room for n: pooled storage when the exporter copies.
func (t *Tracing) newAttrs(n int) []attribute.KeyValue {
	if t.recycle && n <= maxSpanAttrs {
		return attrArrays.Get().(*attrArray)[:0]
	}
	return make([]attribute.KeyValue, 0, n)
}

// newEvents is an empty event slice with room for a span's events, pooled when the exporter copies.
func (t *Tracing) newEvents() []sdktrace.Event {
	if t.recycle {
		return eventArrays.Get().(*eventArray)[:0]
	}
	return make([]sdktrace.Event, 0, spanEvents)
}
