package quota

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/policies"
)

// downAfterFailures consecutive failed admissions mark Redis down.
const downAfterFailures = 3

// ErrUnavailable is returned by Admit when Redis is unreachable and the policy fails closed.
var ErrUnavailable = errors.New("quota store unavailable")

// Metrics are the quota stage's series.
type Metrics struct {
	Rejections  *prometheus.CounterVec // by tenant and limit kind
	BackendUp   prometheus.Gauge
	Transitions *prometheus.CounterVec // by state entered: up, down
	RoundTrips  prometheus.CounterFunc
	// Overshoot counts tokens settled beyond what admission reserved, by tenant: usage the limit check never
	// saw. It stays at zero while every request's output is bounded (max_tokens) and prompts are estimated
	// from above; anything else is charged to the window it was admitted in, and shows here.
	Overshoot *prometheus.CounterVec
	// SettlementsDropped counts settlements given up on after repeated failures (or past what an outage may
	// hold): refunds and freed concurrency slots Redis never saw, which then expire with their keys instead.
	SettlementsDropped prometheus.CounterFunc
}

// Limiter admits and settles requests against tenants' quotas.
type Limiter struct {
	// replayRetries counts probes that reached Redis but could not replay the local admissions (tests).
	replayRetries atomic.Int64
	redis         *redisBackend
	leases        *leases
	live          *liveSlots
	local         *localBackend
	log           *slog.Logger
	up            atomic.Bool
	probing       atomic.Bool
	failures      atomic.Int32 // consecutive failed admissions, a wave of concurrent ones counting once
	// attempts numbers the admissions that may ask Redis, in the order they start; counted is the number
	// reached when the last failure was counted: a failure of an admission that started before it is of the
	// same wave (one stall that every request in flight met) and does not count again.
	attempts, counted atomic.Int64
	metrics           *Metrics
	now               func() time.Time
	ctx               context.Context
	instance          string
}

// Options configure a Limiter.
type Options struct {
	// Addrs are Redis addresses: one for a standalone server, several (or Cluster) for Redis Cluster.
	Addrs   []string
	Cluster bool
	// Password authenticates to Redis (AUTH), empty for none.
	Password string
	Logger   *slog.Logger
	// Registerer receives the metrics; nil skips registration.
	Registerer prometheus.Registerer
	// Now replaces the clock (tests of window rollover).
	Now func() time.Time
	// InstanceID names this gateway across restarts (a Kubernetes pod's name): its concurrency slots carry
	// it, and Reclaim frees those of a previous run at start. Empty: slots of a crashed run free after
	// ConcurrencyTTL. Two running gateways must never share one.
	InstanceID string
	// RenewInterval is how often the concurrency slots of requests in flight are renewed (default
	// ConcurrencyTTL/3); negative turns renewal off, as in a gateway that has died (tests).
	RenewInterval time.Duration
}

// slogRedisLogger sends go-redis's own messages (pool dial failures) to the structured log. go-redis has one
// process-wide logger, so it is installed once and follows the latest limiter's logger.
type slogRedisLogger struct{}

var (
	redisLog     atomic.Pointer[slog.Logger]
	redisLogOnce sync.Once
)

func (slogRedisLogger) Printf(_ context.Context, format string, v ...any) {
	if l := redisLog.Load(); l != nil {
		l.Warn("redis client", "msg", redactAddr(fmt.Errorf(format, v...)))
	}
}

// New connects to Redis (lazily; the first request dials) and starts the settlement flusher, until ctx ends.
func New(ctx context.Context, o Options) *Limiter {
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: o.Addrs, IsClusterMode: o.Cluster, Password: o.Password,
		// Short dial and I/O timeouts: the request path bounds each call with the policy's timeout anyway.
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
		PoolSize: 64, MaxRetries: -1,
		// A connection opened on the request path costs its handshake's round trips before the admission's
		// own: over a link to Redis in another region (docs/regions.md) that outlasted redisTimeout, and the
		// request met the fail mode though Redis was up. So: connections kept open ahead of bursts, and no
		// CLIENT SETINFO round trip on connect (HELLO, which go-redis always sends, is the only one left).
		MinIdleConns: 16, DisableIdentity: true,
		// Without this go-redis ignores the context's deadline on reads and writes, and a hung Redis
		// (SIGSTOP, a stalled failover) holds requests for the full read timeout instead of redisTimeout.
		ContextTimeoutEnabled: true,
	})
	l := &Limiter{redis: newRedisBackend(client), leases: newLeases(), live: newLiveSlots(), local: newLocalBackend(),
		log: o.Logger, now: o.Now, ctx: ctx, instance: o.InstanceID}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	redisLog.Store(l.log)
	redisLogOnce.Do(func() { redis.SetLogger(slogRedisLogger{}) })
	if l.now == nil {
		l.now = time.Now
	}
	l.up.Store(true)
	l.metrics = &Metrics{
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_quota_rejections_total",
			Help: "Requests refused by a quota, by tenant and limit (rps, tpm, conc, spend, conv)."}, []string{"tenant", "limit"}),
		BackendUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "infergate_quota_backend_up",
			Help: "1 while Redis answers; 0 while the policy's fail mode is in force."}),
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_quota_backend_transitions_total",
			Help: "Changes of the quota store's state, by the state entered (up, down)."}, []string{"state"}),
		RoundTrips: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "infergate_quota_redis_round_trips_total",
			Help: "Network round trips to Redis (commands and pipelines)."}, func() float64 { return float64(l.redis.roundTrips.Load()) }),
		Overshoot: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_quota_overshoot_tokens_total",
			Help: "Tokens settled beyond the admission's reservation, by tenant (usage no limit check saw)."}, []string{"tenant"}),
		SettlementsDropped: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "infergate_quota_settlements_dropped_total",
			Help: "Settlements given up on after repeated Redis failures: refunds and freed slots left to expire with their keys."},
			func() float64 { return float64(l.redis.dropped.Load()) }),
	}
	l.metrics.BackendUp.Set(1)
	if o.Registerer != nil {
		o.Registerer.MustRegister(l.metrics.Rejections, l.metrics.BackendUp, l.metrics.Transitions, l.metrics.RoundTrips, l.metrics.Overshoot,
			l.metrics.SettlementsDropped)
	}
	flushed := make(chan struct{})
	go func() {
		// At shutdown every lease is handed back before the last batch goes out.
		l.redis.runFlusher(ctx, time.Second, func() { l.handBack(true) })
		close(flushed)
	}()
	go l.sweepLeases(ctx)
	if every := cmp.Or(o.RenewInterval, renewEvery); every > 0 {
		go l.runRenewer(ctx, every, time.Second)
	}
	// The client closes only after the flusher's last batch, so settlements of a drain are not lost.
	go func() { <-flushed; _ = client.Close() }()
	return l
}

// RoundTrips reports Redis round trips so far, for the one-round-trip-per-request budget.
func (l *Limiter) RoundTrips() int64 { return l.redis.roundTrips.Load() }

// Up reports whether Redis is considered reachable.
func (l *Limiter) Up() bool { return l.up.Load() }

// Admit reserves the request's estimate against every limit that applies. It returns a Ticket to settle
// later, or a Rejection, or ErrUnavailable when Redis is down and the policy fails closed.
func (l *Limiter) Admit(ctx context.Context, r Request) (*Ticket, *Rejection, error) {
	if r.Now.IsZero() {
		r.Now = l.now()
	}
	t := &Ticket{ID: l.ticketID(), Tenant: r.Tenant.Name, entries: entriesFor(r), at: r.Now, est: r.EstimatedTokens, estCost: r.EstimatedCostMicros}
	if len(t.entries) == 0 {
		return t, nil, nil
	}
	settings := r.Snapshot.QuotaSettings()
	l.local.setReplicas(settings.GatewayReplicas)
	if l.up.Load() {
		attempt := l.attempts.Add(1)
		rej, err := l.admitShared(ctx, r, t, settings.GatewayReplicas)
		if err == nil {
			l.failures.Store(0)
			if rej == nil {
				// The fail-open limiter keeps count of what this gateway admitted through Redis too, so that
				// an outage starts from this window's real usage rather than from zero.
				l.local.record(r.Now, t)
				l.budgets(r.Now, t)
				// Last: from here on the renewer may write the ticket's slot members (under its own lock).
				l.live.add(t)
			}
			return l.result(t, rej)
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err() // the client went away, Redis is not to blame
		}
		// One slow reply is not an outage: the fail mode starts after a few consecutive failures, and the
		// requests in flight when Redis stalled once fail together as one. This request meets the fail mode
		// either way.
		if l.countFailure(attempt) >= downAfterFailures {
			l.markDown(err)
		}
		t.ambiguous = t.lostSent != nil && mayHaveRun(err)
	}
	if settings.FailMode == policies.FailClosed {
		l.unreserve(t)
		return nil, nil, ErrUnavailable
	}
	t.local = true
	rej := l.local.admit(r.Now, t, func(key string) (int64, bool) { return l.redis.counted.value(r.Now, key) })
	if rej == nil {
		l.budgets(r.Now, t)
	} else {
		l.unreserve(t)
	}
	return l.result(t, rej)
}

// countFailure counts a failed admission that started with attempt, unless it started before the last counted
// failure was seen (it met the same stall), and returns the consecutive failures.
func (l *Limiter) countFailure(attempt int64) int32 {
	for {
		last := l.counted.Load()
		if attempt <= last {
			return l.failures.Load()
		}
		if l.counted.CompareAndSwap(last, l.attempts.Load()) {
			return l.failures.Add(1)
		}
	}
}

// unreserve resolves a refused request's admission whose reply was lost: whatever it reserved goes back.
func (l *Limiter) unreserve(t *Ticket) {
	if t.ambiguous {
		l.redis.resolveAsync(t, t.lostSent, make([]int64, len(t.entries)))
	}
}

// mayHaveRun says whether an admission that failed with err may have run in Redis: anything but a connection
// that was never made (or a pool that never gave one) may have carried the script before the reply was lost.
func mayHaveRun(err error) bool {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial", errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrClosed):
		return false
	}
	return true
}

// admitShared admits against the shared quotas: from this gateway's leases when they cover every entry,
// otherwise through Redis (which also tops the leases up). A rejection by Redis is retried once when the
// leases receive what the request needs, in the meantime or from a top-up on its way (awaitTopUp): a
// concurrent top-up may have taken the last of a limit for this very gateway.
func (l *Limiter) admitShared(ctx context.Context, r Request, t *Ticket, replicas int) (*Rejection, error) {
	for attempt := 0; ; attempt++ {
		all, refill := l.leases.cover(r.Now, t, r.Snapshot.LeaseFraction(), replicas)
		if all {
			if len(refill) > 0 {
				go l.refill(r.Now, t.Tenant, refill, r.Snapshot.RedisTimeout())
			}
			return nil, nil
		}
		sent := make([]int64, len(t.entries))
		for i := range t.entries {
			sent[i] = t.entries[i].sent()
		}
		cctx, cancel := context.WithTimeout(ctx, r.Snapshot.RedisTimeout())
		granted, rej, err := l.redis.admit(cctx, r.Now, t)
		cancel()
		if err != nil {
			t.lostSent = sent // before restore forgets what the leases covered
		}
		if err != nil || rej != nil {
			l.leases.restore(r.Now, t)
		}
		if rej != nil && attempt == 0 && l.awaitTopUp(ctx, r, t, rej) {
			continue
		}
		if err == nil && rej == nil {
			t.marked = true
			l.leases.grant(r.Now, t.Tenant, t.ID, t.entries, granted)
		}
		return rej, err
	}
}

// awaitTopUp reports whether the lease of the entry a rejection names holds what the request needs, once the
// top-ups on their way to it are answered (for at most the Redis timeout). Such a top-up may hold the limit's
// last units for this very gateway: rejecting without it would admit fewer than the limit.
func (l *Limiter) awaitTopUp(ctx context.Context, r Request, t *Ticket, rej *Rejection) bool {
	cctx, cancel := context.WithTimeout(ctx, r.Snapshot.RedisTimeout())
	defer cancel()
	for {
		enough, answered := l.leases.holds(r.Now, t, rej)
		if enough || answered == nil {
			return enough
		}
		select {
		case <-answered:
		case <-cctx.Done():
			return false
		}
	}
}

// result counts a rejection; a rejected request has no ticket, since nothing was reserved.
func (l *Limiter) result(t *Ticket, rej *Rejection) (*Ticket, *Rejection, error) {
	if rej != nil {
		l.metrics.Rejections.WithLabelValues(t.Tenant, rej.Kind).Inc()
		return nil, rej, nil
	}
	return t, nil, nil
}

// Settle corrects the reservation by the real usage (tokens and micro-USD) and frees the concurrency slot.
// It never blocks on Redis: settlements are sent in batches.
func (l *Limiter) Settle(t *Ticket, tokens, costMicros int64) {
	if t == nil || len(t.entries) == 0 {
		return
	}
	if over := tokens - t.est; over > 0 && t.est > 0 {
		l.metrics.Overshoot.WithLabelValues(t.Tenant).Add(float64(over))
		l.log.Debug("usage exceeded the admission's reservation; charged to the window it was admitted in",
			"tenant", t.Tenant, "reserved_tokens", t.est, "used_tokens", tokens)
	}
	if !t.local {
		// First: once removed, the renewer no longer writes the ticket's entries, which the rest reads.
		l.live.remove(t)
	}
	deltas := settleDeltas(t, tokens, costMicros)
	l.local.settle(t, deltas)
	if t.local {
		if t.ambiguous {
			used := make([]int64, len(t.entries))
			for i := range t.entries {
				used[i] = t.entries[i].use(tokens, costMicros)
			}
			l.redis.resolveAsync(t, t.lostSent, used)
		}
		return
	}
	items := l.leases.settle(l.now(), t, deltas)
	if t.marked {
		items = append(items, settleItem{key: markersKey(t.Tenant), kind: kindMark, member: t.ID})
	}
	l.redis.settleAsync(t.Tenant, t.ID, items)
}

// kindMark is the settle item that deletes an admission's marker.
const kindMark = "mark"

// refill tops up leases that ran low, off the request path. A failure is left for the next admission that
// needs Redis to discover: the leases simply stay low.
func (l *Limiter) refill(now time.Time, tenant string, entries []entry, timeout time.Duration) {
	t := &Ticket{ID: l.ticketID(), Tenant: tenant, entries: entries, refill: true}
	ctx, cancel := context.WithTimeout(l.ctx, timeout)
	granted, _, err := l.redis.admit(ctx, now, t)
	cancel()
	if err != nil {
		granted = nil
	}
	l.leases.grant(now, tenant, t.ID, entries, granted)
}

// sweepLeases hands back idle leases once a second until ctx ends.
func (l *Limiter) sweepLeases(ctx context.Context) {
	everyTick(ctx, time.Second, func() { l.handBack(false) })
}

func (l *Limiter) handBack(all bool) {
	for _, h := range l.leases.sweep(l.now(), all) {
		l.redis.settleAsync(h.tenant, rand.Text(), h.items)
	}
}

// markDown switches to the fail mode and starts probing Redis until it answers again.
func (l *Limiter) markDown(err error) {
	if !l.up.CompareAndSwap(true, false) {
		return
	}
	l.redis.holding.Store(true)
	l.metrics.BackendUp.Set(0)
	l.metrics.Transitions.WithLabelValues("down").Inc()
	l.log.Error("quota store unreachable; applying the policy's fail mode", "err", redactAddr(err))
	if l.probing.CompareAndSwap(false, true) {
		go l.probe()
	}
}

// maxReplayFailures is how many probes in a row may fail to replay local admissions before they are given up
// and shared admission resumes without them (two minutes at the probe's pace): a Redis that answers PING but
// never the script must not hold the quotas in their fail mode for a monthly window.
const maxReplayFailures = 480

func (l *Limiter) probe() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	replayFailures := 0
	for {
		select {
		case <-l.ctx.Done():
			l.probing.Store(false)
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(l.ctx, 200*time.Millisecond)
		err := l.redis.ping(cctx)
		cancel()
		if err == nil {
			// What this gateway admitted on its own goes to Redis before shared admission resumes, so the
			// window goes on from its real usage there too. What does not reach it stays here and is tried
			// again at the next probe, shared admission still off: resuming without it would let the window be
			// spent twice (a Redis Cluster answers the PING from a node whose peer is still failing over).
			rctx, rcancel := context.WithTimeout(l.ctx, time.Second)
			failed, rerr := l.redis.replay(rctx, l.local.takeUnsynced(l.now()))
			if rerr != nil {
				rcancel()
				if replayFailures++; replayFailures < maxReplayFailures {
					l.local.restoreUnsynced(failed)
					l.replayRetries.Add(1)
					l.log.Debug("could not replay local admissions to Redis yet; quotas stay in their fail mode", "err", redactAddr(rerr))
					continue
				}
				l.log.Warn("could not replay local admissions to Redis; those windows are undercounted there", "err", redactAddr(rerr),
					"attempts", replayFailures)
			}
			// Then the settlements held through the outage: slots freed, refunds and charges.
			l.redis.holding.Store(false)
			l.redis.flushPending(rctx, time.Second)
			rcancel()
			// Metrics first, then probing cleared before up: a failure right after must be able to start a
			// new probe.
			l.metrics.BackendUp.Set(1)
			l.metrics.Transitions.WithLabelValues("up").Inc()
			l.probing.Store(false)
			l.failures.Store(0)
			l.up.Store(true)
			l.log.Info("quota store reachable again; enforcing shared quotas")
			return
		}
	}
}

// redactAddr keeps log lines free of anything but the error's gist.
func redactAddr(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "password"); i >= 0 {
		return msg[:i] + "[redacted]"
	}
	return msg
}
