package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/pubsub"
)

// Options configure a Relay.
type Options struct {
	Client  redis.UniversalClient
	Scraper *fleet.Scraper // receives the other replicas' rounds
	// Interval is the scrape interval: the lease is renewed every interval and lasts five, and a replica
	// scrapes itself once no round has arrived for two.
	Interval time.Duration
	Metrics  *Metrics // default: unregistered
	Logger   *slog.Logger
	// Sealer signs the rounds this replica publishes and opens the others'; nil: unsigned.
	Sealer *pubsub.Sealer
	// Now replaces the clock (tests).
	Now func() time.Time
	// Region, when set, is the gateway's region (docs/regions.md): the replicas of one region share their
	// readings among themselves only (ChannelFor, LeaseKeyFor), since a reading depends on where it was taken
	// from — an engine another region cannot reach, or reaches slowly, is not down for this one.
	Region string
}

// Relay is one replica's part: the scraper's fleet.Relay, the lease, the publisher and the subscriber.
type Relay struct {
	o      Options
	origin string
	// channel and leaseKey are the region's (ChannelFor, LeaseKeyFor).
	channel, leaseKey string
	leader            atomic.Bool
	heard             atomic.Int64 // unix nanoseconds of the last round accepted from another replica
	out               chan []fleet.Reading
	ready             chan struct{}
	once              sync.Once

	warner pubsub.Warner
}

// lease takes the key if it is free and renews it if this replica holds it.
var lease = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0`)

// New builds a Relay with a fresh random origin.
func New(o Options) *Relay {
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Interval <= 0 {
		o.Interval = 100 * time.Millisecond
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	return &Relay{o: o, origin: hex.EncodeToString(id[:]), out: make(chan []fleet.Reading, 1), ready: make(chan struct{}),
		warner: pubsub.Warner{Log: o.Logger}, channel: ChannelFor(o.Region), leaseKey: LeaseKeyFor(o.Region)}
}

// Leader reports whether this replica holds the lease and scrapes for the others.
func (r *Relay) Leader() bool { return r.leader.Load() }

// Ready is closed once the subscription is confirmed.
func (r *Relay) Ready() <-chan struct{} { return r.ready }

// Skip implements fleet.Relay: a replica that does not hold the lease skips its scrapes while another's
// rounds keep arriving.
func (r *Relay) Skip() bool {
	if r.leader.Load() {
		return false
	}
	if r.o.Now().Sub(time.Unix(0, r.heard.Load())) < 2*r.o.Interval {
		r.o.Metrics.rounds.WithLabelValues("relayed").Inc()
		return true
	}
	r.o.Metrics.rounds.WithLabelValues("scraped_relay_late").Inc()
	return false
}

// Publish implements fleet.Relay: the lease holder's rounds go out, the newest first if the publisher is
// behind (an older round is worth nothing once a newer one exists).
func (r *Relay) Publish(rs []fleet.Reading) {
	if !r.leader.Load() {
		return
	}
	r.o.Metrics.rounds.WithLabelValues("scraped_leader").Inc()
	for {
		select {
		case r.out <- rs:
			return
		default:
		}
		select {
		case <-r.out:
			r.o.Metrics.dropped.Inc()
		default:
		}
	}
}

// Run holds or waits for the lease, publishes this replica's rounds while it holds it and accepts the
// others' until ctx ends.
func (r *Relay) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { r.keepLease(ctx) })
	wg.Go(func() { r.publish(ctx) })
	pubsub.Subscribe(ctx, r.o.Client, r.channel, func() { r.once.Do(func() { close(r.ready) }) }, r.receive, &r.warner)
	wg.Wait()
}

func (r *Relay) keepLease(ctx context.Context) {
	t := time.NewTicker(r.o.Interval)
	defer t.Stop()
	ttl := (5 * r.o.Interval).Milliseconds()
	for {
		got, err := lease.Run(ctx, r.o.Client, []string{r.leaseKey}, r.origin, ttl).Int()
		held := err == nil && got == 1
		if err != nil && ctx.Err() == nil {
			r.warner.Warn("fleet relay lease", err, "key", r.leaseKey)
		}
		if was := r.leader.Swap(held); was != held {
			r.o.Logger.Info("fleet relay", "scraping_for_all_replicas", held)
		}
		r.o.Metrics.leader.Set(b2f(held))
		select {
		case <-ctx.Done():
			r.leader.Store(false)
			r.o.Metrics.leader.Set(0)
			return
		case <-t.C:
		}
	}
}

func (r *Relay) publish(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case rs := <-r.out:
			msg, err := encode(r.origin, rs, r.o.Now())
			if err == nil {
				err = r.o.Client.Publish(ctx, r.channel, r.o.Sealer.Seal(r.channel, msg)).Err()
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.o.Metrics.dropped.Inc()
				r.warner.Warn("fleet relay: round not published", err, "channel", r.channel)
			}
		}
	}
}

func (r *Relay) receive(msg []byte) {
	now := r.o.Now()
	payload, err := r.o.Sealer.Open(r.channel, msg)
	if err != nil {
		r.o.Metrics.received.WithLabelValues(pubsub.Reason(err)).Inc()
		r.warner.Warn("fleet relay: message dropped", err, "channel", r.channel)
		return
	}
	origin, rs, err := decode(payload, now)
	switch {
	case err != nil:
		r.o.Metrics.received.WithLabelValues("malformed").Inc()
		r.warner.Warn("fleet relay: message dropped", err, "channel", r.channel)
	case origin == r.origin:
		r.o.Metrics.received.WithLabelValues("own").Inc()
	case !r.o.Scraper.AcceptRound(rs):
		// The round misses engines this replica's policy lists (a reload on its way, say): its own scrapes go on.
		r.o.Metrics.received.WithLabelValues("partial").Inc()
	default:
		r.heard.Store(now.UnixNano())
		r.o.Metrics.received.WithLabelValues("accepted").Inc()
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
