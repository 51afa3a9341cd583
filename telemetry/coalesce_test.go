package telemetry

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/infergate/infergate/test/wait"
)

// counting is the next processor: it counts the spans handed to it.
type counting struct{ ended, shut atomic.Int64 }

func (c *counting) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *counting) OnEnd(sdktrace.ReadOnlySpan)                     { c.ended.Add(1) }
func (c *counting) Shutdown(context.Context) error                  { c.shut.Add(1); return nil }
func (c *counting) ForceFlush(context.Context) error                { return nil }

// Ended spans wait in the coalescer until it flushes (its tick, ForceFlush or Shutdown); a burst beyond what
// it holds goes on at once; nothing is lost.
func TestCoalescerHoldsThenHandsOn(t *testing.T) {
	next := &counting{}
	c := newCoalescer(next, time.Hour) // no tick during the test
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c))
	end := func(n int) {
		for range n {
			_, s := tp.Tracer("test").Start(context.Background(), "x")
			s.End()
		}
	}
	end(3)
	if got := next.ended.Load(); got != 0 {
		t.Fatalf("%d spans handed on before a flush", got)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := next.ended.Load(); got != 3 {
		t.Fatalf("%d spans after ForceFlush, want 3", got)
	}
	end(coalesceMax + 2)
	if got := next.ended.Load(); got != 3+2 {
		t.Fatalf("%d spans after a burst past the limit, want the 2 beyond it handed on at once", got)
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := next.ended.Load(); got != 3+coalesceMax+2 || next.shut.Load() != 1 {
		t.Fatalf("%d spans after Shutdown (shut %d), want every one", got, next.shut.Load())
	}
}

// The tick hands held spans on by itself.
func TestCoalescerTicks(t *testing.T) {
	next := &counting{}
	c := newCoalescer(next, time.Millisecond)
	defer func() { _ = c.Shutdown(context.Background()) }()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(c))
	_, s := tp.Tracer("test").Start(context.Background(), "x")
	s.End()
	wait.For(t, "the tick to hand the span on", func() bool { return next.ended.Load() == 1 })
}
