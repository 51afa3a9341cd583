package rollout

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/pubsub"
	"github.com/infergate/infergate/test/redistest"
)

// With the replicas' message key, a rollout state some other Redis client wrote (here: one rolling the
// candidate back) is read as no state and counted, the next swap replaces it, and states the replicas seal
// round-trip; without the key the forgery would be believed.
func TestForgedRolloutStateIsNotBelieved(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	forgery := []byte(`{"phase":"rolledBack","reason":"forged"}`)
	if err := client.Set(ctx, stateKey("m"), forgery, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := NewRedisStore(client).Load(ctx, "m"); string(got) != string(forgery) {
		t.Fatalf("the unsealed store reads %q", got)
	}
	sealer, err := pubsub.NewSealer([]byte("the replicas' shared message key, 32+ bytes"), nil)
	if err != nil {
		t.Fatal(err)
	}
	forged := prometheus.NewCounter(prometheus.CounterOpts{Name: "forged"})
	s := NewSealedStore(NewRedisStore(client), sealer, forged)
	got, err := s.Load(ctx, "m")
	if err != nil || got != nil || testutil.ToFloat64(forged) != 1 {
		t.Fatalf("a forged state read as %q (%v), counted %v", got, err, testutil.ToFloat64(forged))
	}
	state := []byte(`{"phase":"progressing","step":1}`)
	if ok, err := s.Swap(ctx, "m", nil, state); !ok || err != nil {
		t.Fatalf("the forgery was not replaced: %v %v", ok, err)
	}
	if got, err := s.Load(ctx, "m"); err != nil || string(got) != string(state) {
		t.Errorf("the sealed state reads back %q, %v", got, err)
	}
	if ok, _ := s.Swap(ctx, "m", []byte(`{"phase":"checking"}`), state); ok {
		t.Error("a swap from a state that is not current succeeded")
	}
}
