package telemetry

import (
	"context"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// coalesceEvery is how long ended spans wait before they go to the batch processor together.
const coalesceEvery = 10 * time.Millisecond

// coalesceMax is how many ended spans are held at most; beyond it they go on at once.
const coalesceMax = 2048

// coalescer hands ended spans to the SDK's batch span processor in bursts. The batch processor wakes its
// goroutine for every span it is given; on a gateway that ends thousands of spans a second, each wake-up is a
// futex call on the request path and a goroutine competing with the next request for a core. Held here, the
// spans reach it twenty times a second instead, where it batches and exports them as usual.
type coalescer struct {
	next sdktrace.SpanProcessor

	mu   sync.Mutex
	held []sdktrace.ReadOnlySpan

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

func newCoalescer(next sdktrace.SpanProcessor, every time.Duration) *coalescer {
	c := &coalescer{next: next, stop: make(chan struct{}), done: make(chan struct{})}
	go c.run(every)
	return c
}

func (c *coalescer) run(every time.Duration) {
	defer close(c.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			c.flush()
			return
		case <-t.C:
			c.flush()
		}
	}
}

// flush hands every held span on.
func (c *coalescer) flush() {
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for _, s := range held {
		c.next.OnEnd(s)
	}
}

// OnStart implements sdktrace.SpanProcessor.
func (c *coalescer) OnStart(ctx context.Context, s sdktrace.ReadWriteSpan) { c.next.OnStart(ctx, s) }

// OnEnd implements sdktrace.SpanProcessor: it only holds the span.
func (c *coalescer) OnEnd(s sdktrace.ReadOnlySpan) {
	c.mu.Lock()
	if len(c.held) < coalesceMax {
		c.held = append(c.held, s)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.next.OnEnd(s) // a burst beyond what is held: on at once (the batch processor drops past its queue)
}

// ForceFlush implements sdktrace.SpanProcessor.
func (c *coalescer) ForceFlush(ctx context.Context) error {
	c.flush()
	return c.next.ForceFlush(ctx)
}

// Shutdown implements sdktrace.SpanProcessor: held spans go on first.
func (c *coalescer) Shutdown(ctx context.Context) error {
	c.stopOnce.Do(func() { close(c.stop) })
	select {
	case <-c.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.next.Shutdown(ctx)
}
