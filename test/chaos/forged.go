package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/placements"
	"github.com/infergate/infergate/pubsub"
)

// forgeries are the placement messages an attacker who reaches Redis publishes to steer routing: one
// unsigned, one signed with a key of its own, and one replayed with the real key but too old. infergate runs
// with a message key, so each must be dropped and counted under its own result.
var forgeries = []string{"unsigned", "forged", "stale"}

// writeMessageKey gives the gateway the key that signs what replicas share over Redis.
func (s *stack) writeMessageKey() error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	s.messageKey, s.messageKeyPath = key, filepath.Join(s.dir, "redis-message.key")
	return os.WriteFile(s.messageKeyPath, key, 0o600)
}

// publishForgeries sends each forgery, claiming a warm llama replica holds a made-up conversation.
func (s *stack) publishForgeries(ctx context.Context) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.redisAddr})
	defer rdb.Close()
	var origin placements.Origin
	_, _ = rand.Read(origin[:])
	msg := placements.Encode(origin, picker.Placement{Endpoint: s.llamaPool[0], Hashes: []uint64{1, 2, 3, 4}, Capacity: 4096})

	ownKey := make([]byte, 32)
	_, _ = rand.Read(ownKey)
	theirs, err := pubsub.NewSealer(ownKey, time.Now)
	if err != nil {
		return err
	}
	old, err := pubsub.NewSealer(s.messageKey, func() time.Time { return time.Now().Add(-2 * pubsub.MaxMessageAge) })
	if err != nil {
		return err
	}
	for _, m := range [][]byte{msg, theirs.Seal(placements.Channel, msg), old.Seal(placements.Channel, msg)} {
		if err := rdb.Publish(ctx, placements.Channel, m).Err(); err != nil {
			return fmt.Errorf("publishing a forged placement: %w", err)
		}
	}
	return nil
}

// forgeriesDropped waits until infergate has counted each forgery under its result.
func (s *stack) forgeriesDropped() []string {
	var missing []string
	_ = waitFor(10*time.Second, "forged placements counted", func() bool {
		missing = missing[:0]
		for _, result := range forgeries {
			if s.metric("infergate_placements_received_total", fmt.Sprintf(`result=%q`, result)) < 1 {
				missing = append(missing, result)
			}
		}
		return len(missing) == 0
	})
	if len(missing) > 0 {
		return []string{fmt.Sprintf("forged placements not dropped and counted as %v", missing)}
	}
	return nil
}
