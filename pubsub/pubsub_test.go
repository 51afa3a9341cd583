package pubsub

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/test/redistest"
)

// An outage's errors come out once, not once per message.
func TestWarnerLimitsRepeats(t *testing.T) {
	var buf bytes.Buffer
	w := Warner{Log: slog.New(slog.NewTextHandler(&buf, nil))}
	for range 100 {
		w.Warn("publish failed", errors.New("connection refused"), "channel", "c")
	}
	if n := strings.Count(buf.String(), "publish failed"); n != 1 {
		t.Errorf("100 warnings in a row logged %d lines, want 1:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "channel=c") || !strings.Contains(buf.String(), "connection refused") {
		t.Errorf("the warning lost its fields: %s", buf.String())
	}
}

// Ready comes once the subscription is confirmed, and every message published after it is handed over in order.
func TestSubscribeConfirmsThenDelivers(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer func() { _ = client.Close() }()
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan struct{})
	got := make(chan string, 3)
	var wg sync.WaitGroup
	wg.Go(func() {
		Subscribe(ctx, client, "test:chan", func() { close(ready) }, func(b []byte) { got <- string(b) }, &Warner{})
	})
	<-ready
	for _, m := range []string{"a", "b", "c"} {
		if err := client.Publish(ctx, "test:chan", m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"a", "b", "c"} {
		if m := <-got; m != want {
			t.Errorf("got %q, want %q", m, want)
		}
	}
	cancel()
	wg.Wait()
}
