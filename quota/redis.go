package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// admitScript checks every limit and, only if all pass, reserves them: atomic, one round trip. Then it grants
// lease top-ups (see lease.go) best-effort: as much of each entry's extra as fits under its limit.
// KEYS: one per entry, then the tenant's admission markers (a hash). ARGV: now_ms, reservation id, concurrency
// ttl_ms, marker ttl_ms (0: no marker), then per entry kind, limit, amount, window_ms, extra. An amount of 0
// (already covered by this gateway's lease) is not checked. A concurrency entry's own slot is the member id, its
// extra slots id:1, id:2, ... An admission that reserved writes its marker, holding the extras granted: a reply
// lost after the script ran is then resolved exactly (resolveScript) instead of guessed.
// Returns {1, granted extra per entry..., counter after this admission per entry (-1 where it was not read)...}
// or {0, entry index (1-based), used, limit, reset_ms}.
var admitScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local id = ARGV[2]
local ttl = tonumber(ARGV[3])
local markerTTL = tonumber(ARGV[4])
local n = #KEYS - 1
local used = {}
for i = 1, n do
  local b = 4 + (i - 1) * 5
  local kind, limit, amount, window, extra = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  if amount > 0 or extra > 0 then
    if kind == 'conc' then
      redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
      used[i] = redis.call('ZCARD', KEYS[i])
    else
      used[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
    end
    if amount > 0 and used[i] + amount > limit then
      local reset = 1000
      if kind == 'rps' or kind == 'tpm' then reset = window - (now % window) end
      return {0, i, used[i], limit, reset}
    end
  end
end
local out = {1}
local grants = {}
for i = 1, n do
  local b = 4 + (i - 1) * 5
  local kind, limit, amount, window, extra = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local granted = 0
  if extra > 0 then
    granted = math.max(0, math.min(extra, limit - used[i] - amount))
  end
  if kind == 'conc' then
    if amount > 0 then redis.call('ZADD', KEYS[i], now + ttl, id) end
    for j = 1, granted do redis.call('ZADD', KEYS[i], now + ttl, id .. ':' .. j) end
    if amount + granted > 0 then redis.call('PEXPIRE', KEYS[i], ttl) end
  elseif amount + granted > 0 and redis.call('INCRBY', KEYS[i], amount + granted) == amount + granted then
    -- a new counter: give it its expiry once (window keys live two windows, the others their period)
    if kind == 'rps' or kind == 'tpm' then
      redis.call('PEXPIRE', KEYS[i], window * 2)
    else
      redis.call('PEXPIRE', KEYS[i], window)
    end
  end
  out[i + 1] = granted
  grants[i] = tostring(granted)
  if used[i] == nil then
    out[n + i + 1] = -1
  else
    out[n + i + 1] = used[i] + amount + granted
  end
end
if markerTTL > 0 then
  -- The tenant's markers live in one hash, a key that exists and moves with the others when a slot is
  -- resharded (a new key per admission would be split from them for the whole migration). Each marker holds
  -- its expiry; one random other is looked at per admission and dropped once expired (a crashed gateway's).
  local markers = KEYS[n + 1]
  local old = redis.call('HRANDFIELD', markers, 1, 'WITHVALUES')
  if #old == 2 and tonumber(string.match(old[2], '^(%d+)')) < now then
    redis.call('HDEL', markers, old[1])
  end
  redis.call('HSET', markers, id, tostring(now + markerTTL) .. ';' .. table.concat(grants, ','))
  redis.call('PEXPIRE', markers, markerTTL)
end
return out
`)

// settleScript releases concurrency slots and corrects reserved amounts by the real usage, once: a marker
// key makes a retried settlement (after a reply was lost) a no-op. A counter whose window has already
// expired is left alone, so no key is ever recreated without a TTL.
// KEYS: the marker, then one per item. ARGV: marker ttl_ms, then per item kind and, for a concurrency slot,
// its member, otherwise the delta.
var settleScript = redis.NewScript(`
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
for i = 2, #KEYS do
  local kind, value = ARGV[2 * i - 2], ARGV[2 * i - 1]
  if kind == 'conc' then
    redis.call('ZREM', KEYS[i], value)
  elseif kind == 'mark' then
    redis.call('HDEL', KEYS[i], value)
  else
    local delta = tonumber(value)
    if delta ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
      redis.call('INCRBY', KEYS[i], delta)
    end
  end
end
return 1
`)

// resolveScript settles a request whose admission's reply was lost, so that the script may or may not have
// run: its marker says which. Once (a settled marker, as settleScript), it brings each counter to the request's
// real use: when the admission ran, used less what it reserved there (sent) and the extras it granted, which
// the marker holds (no lease ever received them); when it did not, used, added as a replay would.
// KEYS: the settled marker, the tenant's admission markers, then one counter per item. ARGV: settled marker
// ttl_ms, the ticket id, then per item its index among the admission's entries (1-based), used, sent, ttl_ms.
var resolveScript = redis.NewScript(`
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local marker = redis.call('HGET', KEYS[2], ARGV[2])
local grants = marker ~= false
local granted = {}
if grants then
  redis.call('HDEL', KEYS[2], ARGV[2])
  for g in string.gmatch(string.match(marker, ';(.*)$'), '[^,]+') do granted[#granted + 1] = tonumber(g) end
end
for i = 3, #KEYS do
  local b = 2 + (i - 3) * 4
  local index, used, sent, ttl = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4]
  if grants then
    local delta = used - sent - (granted[index] or 0)
    if delta ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
      redis.call('INCRBY', KEYS[i], delta)
    end
  elseif used > 0 and redis.call('INCRBY', KEYS[i], used) == used then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
`)

// replayScript adds what a gateway admitted on its own while Redis was unreachable to a counter, giving a
// counter it creates the expiry admission would have. KEYS: the counter. ARGV: amount, ttl_ms.
var replayScript = redis.NewScript(`
if redis.call('INCRBY', KEYS[1], ARGV[1]) == tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
`)

// replay sends local admissions to Redis, one small script per counter, and returns those that did not reach it
// (with the first error): a Redis Cluster whose slot is still failing over answers a PING from another node and
// refuses the script. The scripts go one by one, not in a pipeline. A script that timed out
// may have run; it is returned too, so that it is counted twice rather than not at all (a stricter window, not
// an overshoot). Recovery replays a handful of counters, once.
func (b *redisBackend) replay(ctx context.Context, items []replay) ([]replay, error) {
	if len(items) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, len(items))
	_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, it := range items {
			windowed := strings.Contains(it.key, ":rps:") || strings.Contains(it.key, ":tpm:")
			cmds[i] = replayScript.Eval(ctx, p, []string{it.key}, it.amount, counterTTL(windowed, it.window).Milliseconds())
		}
		return nil
	})
	if err == nil {
		return nil, nil
	}
	var failed []replay
	for i, c := range cmds {
		if c == nil || c.Err() != nil {
			failed = append(failed, items[i])
		}
	}
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		// A cluster client keeps sending a slot's commands to its dead master until it reloads the slots: ask
		// for them now, so that the next try finds the promoted replica.
		cc.ReloadState(ctx)
	}
	return failed, err
}

// redisBackend is the shared quota store.
type redisBackend struct {
	client     redis.UniversalClient
	roundTrips atomic.Int64
	// dropped counts settlements given up on (failed maxSettleAttempts times, or past maxHeldSettlements): each
	// is a refund or a freed slot Redis never saw, left to expire with its key.
	dropped atomic.Int64

	mu      sync.Mutex
	pending []settlement
	flush   chan struct{}
	// holding is set while Redis is down: settlements wait for it to come back instead of being tried and
	// dropped, so slots freed, refunds and charges made during an outage still reach it.
	holding atomic.Bool
	// counted is what Redis last said each window counter holds, for the remaining budget of admissions.
	counted counters
}

// maxHeldSettlements bounds the settlements kept through an outage; past it the oldest go (their
// reservations then expire on their own).
const maxHeldSettlements = 200_000

// settlement is one idempotent correction: its id names the marker that makes a retry a no-op.
type settlement struct {
	tenant, id string
	items      []settleItem
	attempts   int
	// uncounted: the last attempt failed for a reason that says nothing about the settlement and passes by
	// itself (see passing), so it does not count as one.
	uncounted bool
	noScript  bool // the last attempt met NOSCRIPT
	// resolves is the id of the ticket whose lost admission this settlement resolves (resolveScript); "" for
	// an ordinary settlement.
	resolves string
	// slotsUntil marks what is left of a settlement given up: the concurrency slots it frees, retried however
	// it fails until they would have expired in Redis anyway (see salvageSlots).
	slotsUntil time.Time
}

// settleItem corrects one key: a counter by delta, or frees one concurrency slot (member); kind "mark" deletes
// an admission's marker. A resolution's items (settlement.resolves) carry the entry's index, used, sent and
// the counter's ttl instead.
type settleItem struct {
	key, kind string
	delta     int64
	member    string

	index           int
	used, sent, ttl int64
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

// admit runs the admission script for a ticket's entries: each sends its amount (0 when this gateway's lease
// already covers it) and asks for its extra. Settlements waiting to be sent ride in the same pipeline, before
// it, so under load settling costs no round trip of its own. It returns the extra granted per entry.
func (b *redisBackend) admit(ctx context.Context, now time.Time, t *Ticket) ([]int64, *Rejection, error) {
	if len(t.entries) == 0 {
		return nil, nil, nil
	}
	keys, args := admitArgs(now, t)
	res, err := b.runAdmit(ctx, keys, args)
	if err != nil {
		b.freeLostSlots(t)
		return nil, nil, fmt.Errorf("quota admission: %w", err)
	}
	return b.admitReply(now, t, res)
}

// admitArgs lays out the admission script's KEYS and ARGV for a ticket's entries (see admitScript), built
// once so that a retried admission sends the same.
func admitArgs(now time.Time, t *Ticket) ([]string, []any) {
	keys := make([]string, len(t.entries), len(t.entries)+1)
	args := make([]any, 0, 4+5*len(t.entries))
	marker := admissionMarkerTTL.Milliseconds()
	if t.refill {
		marker = 0 // a lease top-up is never settled as a request: nothing would resolve or delete its marker
	}
	args = append(args, now.UnixMilli(), t.ID, ConcurrencyTTL.Milliseconds(), marker)
	for i, e := range t.entries {
		keys[i] = e.key
		args = append(args, e.kind, e.limit, e.sent(), e.window.Milliseconds(), e.extra)
	}
	return append(keys, markersKey(t.Tenant)), args
}

// runAdmit runs the admission script until it runs or fails for good, and returns its raw reply. It retries
// only where the script is known not to have run: a slot in migration (TRYAGAIN) and, once, a master that
// lost its script cache (NOSCRIPT). The first attempt carries the queued settlements.
func (b *redisBackend) runAdmit(ctx context.Context, keys []string, args []any) ([]int64, error) {
	batch := b.take(maxBatch)
	reloaded := false
	for attempt := 0; ; attempt++ {
		admitCmd, settleNoScript := b.admitOnce(ctx, keys, args, batch)
		batch = nil
		err := admitCmd.Err()
		if err == nil {
			res, err := admitCmd.Int64Slice()
			if !reloaded && settleNoScript {
				// The admission ran but a settlement it carried met a master without its script. Under
				// steady traffic admissions carry every queued settlement, so none would load it.
				_ = b.loadScripts(ctx)
			}
			return res, err
		}
		if redis.IsTryAgainError(err) && attempt < maxTryAgain && pause(ctx, tryAgainPause) {
			continue // the slot is migrating and the script did not run: the move takes milliseconds
		}
		if !isNoScript(err) || reloaded {
			return nil, err
		}
		// Redis lost its script cache (a restart): the admission did not run; load the scripts and retry.
		reloaded = true
		if lerr := b.loadScripts(ctx); lerr != nil {
			return nil, lerr
		}
	}
}

// admitOnce sends one admission in a pipeline with batch's settlements ahead of it, so that settling costs no
// round trip of its own. Settlements that failed go back in the queue (settling is idempotent); it returns
// the admission's command, whose outcome is its own, and whether a settlement met NOSCRIPT.
func (b *redisBackend) admitOnce(ctx context.Context, keys []string, args []any, batch []settlement) (*redis.Cmd, bool) {
	var admitCmd *redis.Cmd
	var settleCmds []*redis.Cmd
	_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		// Settlements go before the admission, so that a slot freed a moment ago (a client that aborted and
		// tries again) is free when the admission runs. But when a node's first command meets an error
		// go-redis retries (TRYAGAIN, as a settlement's new marker key meets mid-resharding), it sends that
		// node's whole pipeline again, commands that succeeded too: the admission would run twice. So a
		// pilot leads: a read of one of the admission's keys, which as a one-key command never gets TRYAGAIN.
		p.Exists(ctx, keys[0])
		settleCmds = addSettlements(ctx, p, batch)
		admitCmd = admitScript.EvalSha(ctx, p, keys, args...)
		return nil
	})
	failed := failedSettlements(batch, settleCmds)
	b.requeue(failed)
	return admitCmd, slices.ContainsFunc(failed, func(s settlement) bool { return s.noScript })
}

// freeLostSlots handles an admission whose outcome is unknown: the script may have run before the reply was
// lost, so it frees the concurrency slots it may hold (ZREM is harmless if it does not). Its counters are
// resolved once the request ends (resolveAsync), by the marker the script leaves when it ran.
func (b *redisBackend) freeLostSlots(t *Ticket) {
	var items []settleItem
	for _, e := range t.entries {
		if e.kind != KindConcurrency {
			continue
		}
		if e.sent() > 0 {
			items = append(items, settleItem{key: e.key, kind: e.kind, member: t.ID})
		}
		for j := int64(1); j <= e.extra; j++ {
			items = append(items, settleItem{key: e.key, kind: e.kind, member: extraMember(t.ID, j)})
		}
	}
	b.settleAsync(t.Tenant, t.ID+":lost", items)
}

// admitReply reads the admission script's reply: the extra granted per entry, noting the counters it reports
// for the remaining budget, or the rejection it names.
func (b *redisBackend) admitReply(now time.Time, t *Ticket, res []int64) ([]int64, *Rejection, error) {
	if len(res) > 0 && res[0] == 1 {
		n := len(t.entries)
		granted := make([]int64, n)
		copy(granted, res[1:])
		if len(res) >= 1+2*n {
			b.counted.note(now, t.entries, res[1+n:1+2*n])
		}
		return granted, nil, nil
	}
	if len(res) < 5 || res[1] < 1 || int(res[1]) > len(t.entries) {
		return nil, nil, fmt.Errorf("quota admission: unexpected reply %v", res)
	}
	e := t.entries[res[1]-1]
	return nil, &Rejection{Kind: e.kind, Scope: e.scope, Used: res[2], Limit: res[3], Requested: e.amount,
		Reset: time.Duration(res[4]) * time.Millisecond}, nil
}

// maxTryAgain and tryAgainPause bound the retries of an admission that met a slot in migration (TRYAGAIN):
// moving a slot's keys takes milliseconds per batch, and the request's redisTimeout still bounds the total.
const (
	maxTryAgain   = 8
	tryAgainPause = 5 * time.Millisecond
)

// pause waits d unless ctx ends first; it reports whether the wait was complete.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// extraMember names the j-th extra concurrency slot the admission script adds for ticket id.
func extraMember(id string, j int64) string { return id + ":" + strconv.FormatInt(j, 10) }

func isNoScript(err error) bool { return err != nil && strings.Contains(err.Error(), "NOSCRIPT") }

// loadScripts loads the scripts on every master, the settlement's first: a master that can admit can then
// settle too.
func (b *redisBackend) loadScripts(ctx context.Context) error {
	if err := settleScript.Load(ctx, b.client).Err(); err != nil {
		return err
	}
	if err := resolveScript.Load(ctx, b.client).Err(); err != nil {
		return err
	}
	return admitScript.Load(ctx, b.client).Err()
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
func (b *redisBackend) settleAsync(tenant, id string, items []settleItem) {
	b.enqueue(settlement{tenant: tenant, id: id, items: items})
}

// enqueue queues a settlement (or a resolution) for the flusher, waking it when it may be idle.
func (b *redisBackend) enqueue(s settlement) {
	if len(s.items) == 0 {
		return
	}
	b.mu.Lock()
	b.pending = append(b.pending, s)
	b.trimHeld()
	n := len(b.pending)
	b.mu.Unlock()
	if n == 1 || n >= maxBatch {
		b.wakeFlusher()
	}
}

// wakeFlusher asks the flusher to send what is queued, without waiting.
func (b *redisBackend) wakeFlusher() {
	select {
	case b.flush <- struct{}{}:
	default:
	}
}

const (
	maxBatch = 256
	// batchDelay is how long a settlement may wait for an admission to carry it before it is sent on its own;
	// under steady traffic admissions carry them all and settling costs no round trip.
	batchDelay = 10 * time.Millisecond
)

// runFlusher sends queued settlements until ctx ends, then sends what is left.
func (b *redisBackend) runFlusher(ctx context.Context, timeout time.Duration, beforeLast func()) {
	for {
		select {
		case <-ctx.Done():
			beforeLast()
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
	for !b.holding.Load() {
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

// requeue puts a failed batch back for another attempt, dropping settlements that failed too often, and wakes
// the flusher: when traffic stops after the batch an admission carried failed, no admission carries it again.
func (b *redisBackend) requeue(batch []settlement) {
	if len(batch) == 0 {
		return
	}
	defer b.wakeFlusher()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range batch {
		if b.holding.Load() {
			b.pending = append(b.pending, s) // Redis is down: this failure says nothing about the settlement
		} else if s.uncounted {
			s.uncounted = false // the slot is moving, or the script is being loaded: not the settlement's fault
			b.pending = append(b.pending, s)
		} else if s.attempts++; s.attempts < maxSettleAttempts || time.Now().Before(s.slotsUntil) {
			b.pending = append(b.pending, s)
		} else {
			b.dropped.Add(1)
			if slots, ok := salvageSlots(s); ok {
				b.pending = append(b.pending, slots)
			}
		}
	}
	b.trimHeld()
}

// salvageSlots is what is kept of a settlement given up: its concurrency slots to free, retried until they
// expire. A refund or a lease handed back is dropped with it, since it may answer for a write Redis lost (a
// failover's unreplicated admission or top-up) and applied later would let the window overshoot; freeing a
// slot never can (ZREM of a member Redis lost is a no-op), and a slot left taken refuses the tenant's next
// requests until its TTL — the whole outage and after it, for a gateway whose Redis stalled or restarted.
func salvageSlots(s settlement) (settlement, bool) {
	if !s.slotsUntil.IsZero() || s.resolves != "" {
		return settlement{}, false
	}
	var items []settleItem
	for _, it := range s.items {
		if it.kind == KindConcurrency && it.member != "" {
			items = append(items, it)
		}
	}
	if len(items) == 0 {
		return settlement{}, false
	}
	return settlement{tenant: s.tenant, id: s.id + ":slots", items: items, slotsUntil: time.Now().Add(ConcurrencyTTL)}, true
}

// trimHeld drops the oldest settlements past maxHeldSettlements, counting them; b.mu is held.
func (b *redisBackend) trimHeld() {
	if n := len(b.pending); n > maxHeldSettlements {
		b.dropped.Add(int64(n - maxHeldSettlements))
		b.pending = b.pending[n-maxHeldSettlements:]
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
// batch order.
func addSettlements(ctx context.Context, p redis.Pipeliner, batch []settlement) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(batch))
	for k, s := range batch {
		if s.resolves != "" {
			cmds[k] = addResolution(ctx, p, s)
			continue
		}
		keys := make([]string, 0, 1+len(s.items))
		args := make([]any, 0, 1+2*len(s.items))
		keys = append(keys, "ig:"+tag(s.tenant)+":settled:"+s.id)
		args = append(args, settledMarkerTTL.Milliseconds())
		for _, it := range s.items {
			keys = append(keys, it.key)
			if it.kind == KindConcurrency || it.kind == kindMark {
				args = append(args, it.kind, it.member)
			} else {
				args = append(args, it.kind, it.delta)
			}
		}
		cmds[k] = settleScript.EvalSha(ctx, p, keys, args...)
	}
	return cmds
}

// addResolution queues a resolution's script (resolveScript) on a pipeline.
func addResolution(ctx context.Context, p redis.Pipeliner, s settlement) *redis.Cmd {
	keys := make([]string, 0, 2+len(s.items))
	args := make([]any, 0, 1+4*len(s.items))
	keys = append(keys, "ig:"+tag(s.tenant)+":settled:"+s.id, markersKey(s.tenant))
	args = append(args, settledMarkerTTL.Milliseconds(), s.resolves)
	for _, it := range s.items {
		keys = append(keys, it.key)
		args = append(args, it.index, it.used, it.sent, it.ttl)
	}
	return resolveScript.EvalSha(ctx, p, keys, args...)
}

// failedSettlements picks the settlements whose command failed, for another attempt (safe: settling is
// idempotent).
func failedSettlements(batch []settlement, cmds []*redis.Cmd) []settlement {
	var out []settlement
	for k, c := range cmds {
		if c != nil && c.Err() != nil && !errors.Is(c.Err(), redis.Nil) {
			s := batch[k]
			s.uncounted = passing(c.Err())
			s.noScript = isNoScript(c.Err())
			out = append(out, s)
		}
	}
	return out
}

// passing reports an error after which a settlement did not run and will once a passing condition ends, so
// the failure says nothing about the settlement:
//   - the command's slot is being moved between masters: TRYAGAIN (mid-migration, a script's keys are split
//     between the two masters; the settled marker a settlement creates is always new, so every settlement
//     meets it until the slot's keys have moved), or a redirect go-redis gave up following;
//   - the node lacks the settlement script (NOSCRIPT: a restarted or new master, or the moment between
//     loading the scripts), which whoever meets it loads again;
//   - the cluster is between states: CLUSTERDOWN (a master failed and its replica is not promoted yet),
//     LOADING (a restarted node reading its dataset), MASTERDOWN (a replica that lost its master).
//
// Counted as failures, a few milliseconds of either dropped settlements under load: each admission carries
// the queued ones, and five admissions take less time than loading a script on every master.
func passing(err error) bool {
	if redis.IsTryAgainError(err) || isNoScript(err) || redis.IsClusterDownError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) {
		return true
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	_, ok := redis.IsAskError(err)
	return ok
}

func (b *redisBackend) ping(ctx context.Context) error { return b.client.Ping(ctx).Err() }

// admissionMarkerTTL is how long an admission's marker lives (admitScript): longer than a request, so that a
// lost reply is resolved exactly; a settlement deletes it sooner.
const admissionMarkerTTL = 10 * time.Minute

// markersKey names the hash of a tenant's admission markers (field: ticket id), in its tenant's slot.
func markersKey(tenant string) string { return "ig:" + tag(tenant) + ":admitted" }

// counterTTL is the expiry a counter created by a replay or a resolution gets, as the admission script gives
// it: window keys (requests and tokens per window) live two windows, the others their period.
func counterTTL(windowed bool, window time.Duration) time.Duration {
	if windowed {
		window *= 2
	}
	return max(window, time.Second)
}

// resolveAsync queues the resolution of an admission whose reply was lost (resolveScript): each counter entry
// brought to used[i], given what the lost attempt sent (sent[i]).
func (b *redisBackend) resolveAsync(t *Ticket, sent, used []int64) {
	var items []settleItem
	for i := range t.entries {
		e := &t.entries[i]
		if e.kind == KindConcurrency {
			continue // freeLostSlots freed its slots
		}
		items = append(items, settleItem{key: e.key, kind: e.kind, index: i + 1, used: used[i], sent: sent[i],
			ttl: counterTTL(e.kind == KindRequests || e.kind == KindTokens, e.window).Milliseconds()})
	}
	b.enqueue(settlement{tenant: t.Tenant, id: t.ID + ":resolved", items: items, resolves: t.ID})
}
