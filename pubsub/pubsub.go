// Package pubsub is the Redis pub/sub plumbing gateway replicas share state over (the placements and the fleet
// relay): a subscription that counts only once Redis confirmed it, is retried after a failure and reports when
// it is ready, and warnings limited so that an outage does not log once per message.
package pubsub

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Subscribe hands every message on channel to handle until ctx ends. ready is called once, when Redis first
// confirms the subscription; until then it retries every second, warning through w. go-redis subscribes again
// by itself after a lost connection; what was published meanwhile is lost.
func Subscribe(ctx context.Context, client redis.UniversalClient, channel string, ready func(), handle func([]byte), w *Warner) {
	ps := client.Subscribe(ctx, channel)
	defer func() { _ = ps.Close() }()
	for ctx.Err() == nil {
		_, err := ps.Receive(ctx)
		if err == nil {
			break
		}
		if ctx.Err() == nil {
			w.Warn("subscribing", err, "channel", channel)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	if ctx.Err() != nil {
		return
	}
	ready()
	msgs := ps.Channel(redis.WithChannelSize(64))
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			handle([]byte(m.Payload))
		}
	}
}

// Warner logs a warning at most once every ten seconds (a Redis outage would otherwise log every message).
type Warner struct {
	Log *slog.Logger

	mu   sync.Mutex
	last time.Time
}

// Warn logs msg with err and args unless a warning went out less than ten seconds ago.
func (w *Warner) Warn(msg string, err error, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := time.Now(); now.Sub(w.last) >= 10*time.Second {
		w.last = now
		if w.Log != nil {
			w.Log.Warn(msg, append([]any{"err", err}, args...)...)
		}
	}
}
