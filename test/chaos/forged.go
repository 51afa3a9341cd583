package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/placements"
	"github.com/infergate/infergate/pubsub"
	"github.com/infergate/infergate/relay"
)

// forgeries are the messages an attacker who reaches Redis publishes to steer routing, on each channel replicas
// share: one unsigned, one signed with a key of its own, and one replayed with the real key but too old.
// infergate runs with a message key, so each must be dropped and counted under its own result.
var forgeries = []string{"unsigned", "forged", "stale"}

// forgedChannel is a channel replicas share over Redis, the message forged on it and the counter infergate
// drops it under. (A rollout's shared state is a key, not a channel: rollout's TestForgedRolloutStateIsNotBelieved.)
type forgedChannel struct {
	what, channel, metric string
	message               []byte
}

// forgedChannels: a placement claiming a warm llama replica holds a made-up conversation, a long prompt (the
// longest a message may claim, due at the last moment it may be) that makes it look busy, and a round of engine
// readings, complete as a replica's would be (one naming only some engines counts as partial: its readings are
// stored, but the replica keeps scraping for itself), that calls that replica saturated, to drain its traffic to
// the other.
func (s *stack) forgedChannels() []forgedChannel {
	var origin placements.Origin
	_, _ = rand.Read(origin[:])
	placement := placements.Encode(origin, picker.Placement{Endpoint: s.llamaPool[0], Hashes: []uint64{1, 2, 3, 4}, Capacity: 4096})
	longPrompt := placements.Encode(origin, picker.Placement{Endpoint: s.llamaPool[0], Prefill: picker.MaxPublishedPrefill,
		Due: picker.MaxPrefillDue, ID: 1})
	const reading = `{"addr":%q,"running":%d,"waiting":%d,"kvUtil":%d,"ageMs":0}`
	round := fmt.Appendf(nil, `{"origin":"forger","readings":[`+reading+`,`+reading+`,`+reading+`,`+reading+`]}`,
		s.llamaPool[0], 128, 512, 1, s.llamaPool[1], 0, 0, 0, s.qwenPool[0], 0, 0, 0, s.qwenPool[1], 0, 0, 0)
	return []forgedChannel{
		{"placements", placements.Channel, "infergate_placements_received_total", placement},
		{"long prompts", placements.Channel, "infergate_placements_received_total", longPrompt},
		{"engine readings", relay.Channel, "infergate_fleet_relay_messages_total", round},
	}
}

// writeMessageKey gives the gateway the key that signs what replicas share over Redis, as printable text: the
// gateway trims the file's surrounding white space, which 32 raw random bytes start or end with one time in 22.
func (s *stack) writeMessageKey() error {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	s.messageKey, s.messageKeyPath = []byte(hex.EncodeToString(raw)), filepath.Join(s.dir, "redis-message.key")
	return os.WriteFile(s.messageKeyPath, s.messageKey, 0o600)
}

// publishForgeries sends each forgery on each channel.
func (s *stack) publishForgeries(ctx context.Context) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.redisAddr})
	defer rdb.Close()
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
	for _, fc := range s.forgedChannels() {
		for _, m := range [][]byte{fc.message, theirs.Seal(fc.channel, fc.message), old.Seal(fc.channel, fc.message)} {
			if err := rdb.Publish(ctx, fc.channel, m).Err(); err != nil {
				return fmt.Errorf("publishing forged %s: %w", fc.what, err)
			}
		}
	}
	return nil
}

// forgeriesDropped waits until infergate has counted each forgery on each channel under its result (forgeries on
// one counter add up).
func (s *stack) forgeriesDropped() []string {
	var missing []string
	channels := s.forgedChannels()
	perMetric := map[string]float64{}
	for _, fc := range channels {
		perMetric[fc.metric]++
	}
	_ = waitFor(10*time.Second, "forgeries counted", func() bool {
		missing = missing[:0]
		for _, fc := range channels {
			for _, result := range forgeries {
				if s.metric(fc.metric, fmt.Sprintf(`result=%q`, result)) < perMetric[fc.metric] {
					missing = append(missing, fc.what+" "+result)
				}
			}
		}
		return len(missing) == 0
	})
	if len(missing) > 0 {
		return []string{fmt.Sprintf("forgeries not dropped and counted: %v", missing)}
	}
	return nil
}
