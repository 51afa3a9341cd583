package placements

import (
	"cmp"
	"context"
	"crypto/rand"
	"log/slog"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/pubsub"
)

// DefaultQueue is how many placements may wait to be published; beyond it they are dropped (and counted),
// never waited for: a replica that misses one places that group on its own view, as without sharing.
const DefaultQueue = 4096

// Options configure a Bus.
type Options struct {
	Client  redis.UniversalClient
	Metrics *Metrics // default: unregistered
	Logger  *slog.Logger
	Queue   int // default DefaultQueue
	// Sealer signs the placements this replica publishes and opens the others'; nil: unsigned.
	Sealer *pubsub.Sealer
}

// Bus carries placements between gateway replicas: Publish queues this replica's, Run sends them and hands
// every other replica's to learn. It implements picker.Placements.
type Bus struct {
	client  redis.UniversalClient
	origin  Origin
	queue   chan []byte
	metrics *Metrics
	log     *slog.Logger
	ready   chan struct{}
	once    sync.Once
	sealer  *pubsub.Sealer

	warner pubsub.Warner
}

// New builds a Bus with a fresh random origin.
func New(o Options) *Bus {
	b := &Bus{client: o.Client, queue: make(chan []byte, cmp.Or(max(0, o.Queue), DefaultQueue)), metrics: o.Metrics,
		log: o.Logger, ready: make(chan struct{}), sealer: o.Sealer}
	if b.metrics == nil {
		b.metrics = NewMetrics(nil)
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	b.warner.Log = b.log
	_, _ = rand.Read(b.origin[:])
	return b
}

// Publish queues a placement for the other replicas; it never blocks.
func (b *Bus) Publish(pl picker.Placement) {
	select {
	case b.queue <- Encode(b.origin, pl):
	default:
		b.metrics.dropped.WithLabelValues("queue_full").Inc()
	}
}

// PublishChurn queues this replica's churn report (picker.ChurnPublisher): one message for up to
// MaxChurnEntries endpoints, rather than one per endpoint. It never blocks.
func (b *Bus) PublishChurn(blocks map[string]int) {
	for _, msg := range EncodeChurn(b.origin, blocks) {
		select {
		case b.queue <- msg:
		default:
			b.metrics.dropped.WithLabelValues("queue_full").Inc()
		}
	}
}

// Ready is closed once the first subscription is confirmed: from then on this replica hears the others.
func (b *Bus) Ready() <-chan struct{} { return b.ready }

// Run publishes queued placements and delivers the others' to learn until ctx ends. A message lost while
// Redis is away costs agreement, not correctness.
func (b *Bus) Run(ctx context.Context, learn func(picker.Placement) bool) {
	var wg sync.WaitGroup
	wg.Go(func() { b.publish(ctx) })
	pubsub.Subscribe(ctx, b.client, Channel, func() { b.once.Do(func() { close(b.ready) }) },
		func(msg []byte) { b.receive(msg, learn) }, &b.warner)
	wg.Wait()
}

func (b *Bus) publish(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case msg := <-b.queue:
			if err := b.client.Publish(ctx, Channel, b.sealer.Seal(Channel, msg)).Err(); err != nil {
				if ctx.Err() != nil {
					return
				}
				b.metrics.dropped.WithLabelValues("redis").Inc()
				b.warner.Warn("placement not published", err, "channel", Channel)
				continue
			}
			b.metrics.published.Inc()
		}
	}
}

// receive decodes one message and hands its placements to learn, unless it is this replica's own.
func (b *Bus) receive(msg []byte, learn func(picker.Placement) bool) {
	payload, err := b.sealer.Open(Channel, msg)
	if err != nil {
		b.metrics.received.WithLabelValues(pubsub.Reason(err)).Inc()
		b.warner.Warn("placement message dropped", err, "channel", Channel)
		return
	}
	origin, pls, err := DecodeMessage(payload)
	switch {
	case err != nil:
		b.metrics.received.WithLabelValues("malformed").Inc()
		b.warner.Warn("placement message dropped", err, "channel", Channel)
		return
	case origin == b.origin:
		b.metrics.received.WithLabelValues("own").Inc()
		return
	}
	for _, pl := range pls {
		switch {
		case !learn(pl):
			b.metrics.received.WithLabelValues("unknown_endpoint").Inc()
		case pl.Forgotten:
			b.metrics.received.WithLabelValues("forgotten").Inc()
		case pl.Churn > 0:
			b.metrics.received.WithLabelValues("churn").Inc()
		case pl.Prefill > 0:
			b.metrics.received.WithLabelValues("prefill").Inc()
		case pl.Done:
			b.metrics.received.WithLabelValues("prefill_done").Inc()
		default:
			b.metrics.received.WithLabelValues("learnt").Inc()
		}
	}
}
