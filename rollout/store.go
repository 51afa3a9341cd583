package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Store keeps every model's rollout state where all gateway replicas read it. A state is an opaque document
// swapped only when nobody changed it since it was read, so two replicas deciding at once cannot both win.
type Store interface {
	// Load returns a model's state document, nil when there is none.
	Load(ctx context.Context, model string) ([]byte, error)
	// Swap replaces the document old (nil: none) with next; ok is false when old is no longer current.
	Swap(ctx context.Context, model string, old, next []byte) (ok bool, err error)
	// Shared says whether other gateway replicas see the same states.
	Shared() bool
}

// MemoryStore keeps states in this process: one replica, and a restart starts every rollout over.
type MemoryStore struct {
	mu     sync.Mutex
	states map[string][]byte
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{states: map[string][]byte{}} }

// Load implements Store.
func (m *MemoryStore) Load(_ context.Context, model string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.states[model]), nil
}

// Swap implements Store.
func (m *MemoryStore) Swap(_ context.Context, model string, old, next []byte) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !bytes.Equal(m.states[model], old) {
		return false, nil
	}
	m.states[model] = bytes.Clone(next)
	return true, nil
}

// Shared implements Store.
func (*MemoryStore) Shared() bool { return false }

// RedisStore keeps states in Redis under infergate:rollout:{model}, without expiry: they outlive every gateway
// restart. A rollout dropped from the policy leaves its state; put back unchanged (same candidate and steps)
// it resumes where it was, and any other rollout of the model starts over.
type RedisStore struct {
	client redis.UniversalClient
}

// NewRedisStore uses client (a single node or a cluster: each state is one key).
func NewRedisStore(client redis.UniversalClient) *RedisStore { return &RedisStore{client: client} }

func stateKey(model string) string { return "infergate:rollout:{" + model + "}" }

// swapScript sets KEYS[1] to ARGV[2] when it holds ARGV[1] (ARGV[1] empty: when it does not exist).
var swapScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false then cur = '' end
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1`)

// Load implements Store.
func (r *RedisStore) Load(ctx context.Context, model string) ([]byte, error) {
	b, err := r.client.Get(ctx, stateKey(model)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rollout state of %s: %w", model, err)
	}
	return b, nil
}

// Swap implements Store.
func (r *RedisStore) Swap(ctx context.Context, model string, old, next []byte) (bool, error) {
	n, err := swapScript.Run(ctx, r.client, []string{stateKey(model)}, old, next).Int()
	if err != nil {
		return false, fmt.Errorf("rollout state of %s: %w", model, err)
	}
	return n == 1, nil
}

// Shared implements Store.
func (*RedisStore) Shared() bool { return true }

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
