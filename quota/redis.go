package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// admitScript checks every limit and, only if all pass, reserves them: atomic, one round trip.
// KEYS: one per entry. ARGV: now_ms, reservation id, concurrency ttl_ms, then per entry kind, limit, amount,
// window_ms. Returns {1} or {0, entry index (1-based), used, limit, reset_ms}.
var admitScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local id = ARGV[2]
local ttl = tonumber(ARGV[3])
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 4
  local kind, limit, amount, window = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local used
  if kind == 'conc' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    used = redis.call('ZCARD', KEYS[i])
  else
    used = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  if used + amount > limit then
    local reset = 1000
    if kind == 'rps' or kind == 'tpm' then reset = window - (now % window) end
    return {0, i, used, limit, reset}
  end
end
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 4
  local kind, amount, window = ARGV[b + 1], tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  if kind == 'conc' then
    redis.call('ZADD', KEYS[i], now + ttl, id)
    redis.call('PEXPIRE', KEYS[i], ttl)
  elseif redis.call('INCRBY', KEYS[i], amount) == amount then
    -- a new counter: give it its expiry once (window keys live two windows, the others their period)
    if kind == 'rps' or kind == 'tpm' then
      redis.call('PEXPIRE', KEYS[i], window * 2)
    else
      redis.call('PEXPIRE', KEYS[i], window)
    end
  end
end
return {1}
`)

// settleScript releases a concurrency slot and corrects reserved amounts by the real usage, once: a marker
// key makes a retried settlement (after a reply was lost) a no-op. A counter whose window has already
// expired is left alone, so no key is ever recreated without a TTL.
// KEYS: the marker, then one per entry. ARGV: reservation id, marker ttl_ms, then per entry kind, delta.
var settleScript = redis.NewScript(`
local id = ARGV[1]
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then
  return 0
end
for i = 2, #KEYS do
  local kind, delta = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  if kind == 'conc' then
    redis.call('ZREM', KEYS[i], id)
  elseif delta ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], delta)
  end
end
return 1
`)

// redisBackend is the shared quota store.
type redisBackend struct {
	client     redis.UniversalClient
	roundTrips atomic.Int64

	mu      sync.Mutex
	pending []settlement
	flush   chan struct{}
}

type settlement struct {
	t        *Ticket
	deltas   []int64
	attempts int
}

// settledMarkerTTL is how long a settlement's marker lives: long enough to cover its retries, short enough
// that a busy gateway's markers do not pile up in Redis.
const settledMarkerTTL = 2 * time.Minute

// maxSettleAttempts bounds retries of a settlement while Redis is failing; after that the reservation
// expires on its own (concurrency slots by TTL, windows at their end).
const maxSettleAttempts = 5

// roundTripCounter counts network round trips: each command or pipeline sent.
type roundTripCounter struct{ n *atomic.Int64 }

func (h roundTripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h roundTripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h roundTripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func newRedisBackend(client redis.UniversalClient) *redisBackend {
	b := &redisBackend{client: client, flush: make(chan struct{}, 1)}
	client.AddHook(roundTripCounter{&b.roundTrips})
	return b
}

// admit runs the admission script. Settlements waiting to be sent ride in the same pipeline, so under load
// settling costs no round trip of its own.
func (b *redisBackend) admit(ctx context.Context, now time.Time, t *Ticket) (*Rejection, error) {
	if len(t.entries) == 0 {
		return nil, nil
	}
	keys := make([]string, len(t.entries))
	args := make([]any, 0, 3+4*len(t.entries))
	args = append(args, now.UnixMilli(), t.ID, ConcurrencyTTL.Milliseconds())
	for i, e := range t.entries {
		keys[i] = e.key
		args = append(args, e.kind, e.limit, e.amount, e.window.Milliseconds())
	}
	batch := b.take(maxBatch)
	var res []int64
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var admitCmd *redis.Cmd
		var settleCmds []*redis.Cmd
		_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			settleCmds = addSettlements(ctx, p, batch)
			admitCmd = admitScript.EvalSha(ctx, p, keys, args...)
			return nil
		})
		// Settlements that failed go back in the queue (settling is idempotent); the admission's outcome is
		// its own command's.
		b.requeue(failedSettlements(batch, settleCmds))
		batch = nil
		err = admitCmd.Err()
		if err == nil {
			res, err = admitCmd.Int64Slice()
			break
		}
		if !isNoScript(err) {
			break
		}
		// Redis lost its script cache (a restart): the admission did not run; load the scripts and retry.
		if lerr := b.loadScripts(ctx); lerr != nil {
			err = lerr
			break
		}
	}
	if err != nil {
		// The script may have run before the reply was lost: free the concurrency slot it may hold (ZREM is
		// harmless if it does not). Counters are left alone: refunding what was never added would drift.
		release := make([]int64, len(t.entries))
		b.settleAsync(&Ticket{ID: t.ID, Tenant: t.Tenant, entries: concOnly(t.entries)}, release)
		return nil, fmt.Errorf("quota admission: %w", err)
	}
	if len(res) == 0 || res[0] == 1 {
		return nil, nil
	}
	if len(res) < 5 || res[1] < 1 || int(res[1]) > len(t.entries) {
		return nil, fmt.Errorf("quota admission: unexpected reply %v", res)
	}
	e := t.entries[res[1]-1]
	return &Rejection{Kind: e.kind, Scope: e.scope, Used: res[2], Limit: res[3], Requested: e.amount,
		Reset: time.Duration(res[4]) * time.Millisecond}, nil
}

func concOnly(es []entry) []entry {
	var out []entry
	for _, e := range es {
		if e.kind == KindConcurrency {
			out = append(out, e)
		}
	}
	return out
}

func isNoScript(err error) bool { return err != nil && strings.Contains(err.Error(), "NOSCRIPT") }

func (b *redisBackend) loadScripts(ctx context.Context) error {
	if err := admitScript.Load(ctx, b.client).Err(); err != nil {
		return err
	}
	return settleScript.Load(ctx, b.client).Err()
}

// take removes up to n queued settlements.
func (b *redisBackend) take(n int) []settlement {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := min(n, len(b.pending))
	if k == 0 {
		return nil
	}
	batch := slices.Clone(b.pending[:k])
	b.pending = b.pending[k:]
	return batch
}

// settleAsync queues a settlement; the flusher sends queued settlements together in one pipeline, so settling
// costs a fraction of a round trip per request.
func (b *redisBackend) settleAsync(t *Ticket, deltas []int64) {
	b.mu.Lock()
	b.pending = append(b.pending, settlement{t: t, deltas: deltas})
	n := len(b.pending)
	b.mu.Unlock()
	if n == 1 || n >= maxBatch {
		select {
		case b.flush <- struct{}{}:
		default:
		}
	}
}

const (
	maxBatch = 256
	// batchDelay is how long a settlement may wait for an admission to carry it before it is sent on its own;
	// under steady traffic admissions carry them all and settling costs no round trip.
	batchDelay = 10 * time.Millisecond
)

// runFlusher sends queued settlements until ctx ends, then sends what is left.
func (b *redisBackend) runFlusher(ctx context.Context, timeout time.Duration) {
	for {
		select {
		case <-ctx.Done():
			b.flushPending(context.Background(), timeout)
			return
		case <-b.flush:
		}
		// Let concurrent settlements join this batch.
		select {
		case <-time.After(batchDelay):
		case <-ctx.Done():
		}
		b.flushPending(ctx, timeout)
	}
}

func (b *redisBackend) flushPending(ctx context.Context, timeout time.Duration) {
	for {
		batch := b.take(maxBatch)
		if len(batch) == 0 {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		failed, err := b.sendSettlements(cctx, batch)
		if isNoScript(err) && b.loadScripts(cctx) == nil {
			failed, err = b.sendSettlements(cctx, failed)
		}
		cancel()
		if len(failed) > 0 || err != nil {
			b.requeue(failed)
			if ctx.Err() != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// requeue puts a failed batch back for another attempt, dropping settlements that failed too often.
func (b *redisBackend) requeue(batch []settlement) {
	if len(batch) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range batch {
		if s.attempts++; s.attempts < maxSettleAttempts {
			b.pending = append(b.pending, s)
		}
	}
}

// sendSettlements sends a batch and returns the settlements that failed.
func (b *redisBackend) sendSettlements(ctx context.Context, batch []settlement) ([]settlement, error) {
	var cmds []*redis.Cmd
	_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmds = addSettlements(ctx, p, batch)
		return nil
	})
	failed := failedSettlements(batch, cmds)
	if err != nil && len(failed) == 0 && cmds != nil {
		failed = batch // the pipeline failed before any command had its own result
	}
	return failed, err
}

// addSettlements queues one settle script call per settlement on a pipeline and returns the commands, in
// batch order (nil where a settlement had nothing to send).
func addSettlements(ctx context.Context, p redis.Pipeliner, batch []settlement) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(batch))
	for k, s := range batch {
		keys := make([]string, 0, 1+len(s.t.entries))
		args := make([]any, 0, 2+2*len(s.t.entries))
		keys = append(keys, "ig:"+tag(s.t.Tenant)+":settled:"+s.t.ID)
		args = append(args, s.t.ID, settledMarkerTTL.Milliseconds())
		for i, e := range s.t.entries {
			if e.kind == KindRequests {
				continue
			}
			keys = append(keys, e.key)
			args = append(args, e.kind, s.deltas[i])
		}
		if len(keys) > 1 {
			cmds[k] = settleScript.EvalSha(ctx, p, keys, args...)
		}
	}
	return cmds
}

// failedSettlements picks the settlements whose command failed, for another attempt (safe: settling is
// idempotent).
func failedSettlements(batch []settlement, cmds []*redis.Cmd) []settlement {
	var out []settlement
	for k, c := range cmds {
		if c != nil && c.Err() != nil && !errors.Is(c.Err(), redis.Nil) {
			out = append(out, batch[k])
		}
	}
	return out
}

func (b *redisBackend) ping(ctx context.Context) error { return b.client.Ping(ctx).Err() }
