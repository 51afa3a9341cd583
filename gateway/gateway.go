// Package gateway assembles infergate from its configuration: the policy store, metrics, quotas in Redis,
// the engine scraper, the ext_proc server with its director, and the xDS control plane fed by the fleet
// state. infergate serve runs this graph behind its listeners, and the end-to-end tests run the same one.
package gateway

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/capacity"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/discovery"
	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/placements"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/pubsub"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/relay"
	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/shadow"
	"github.com/infergate/infergate/telemetry"
	"github.com/infergate/infergate/xds"
)

// Config is what the graph is built from.
type Config struct {
	PolicyPath string
	// RedisAddrs enforce tenants' quotas (one address, or several for Redis Cluster); none: no quotas.
	RedisAddrs []string
	// RedisPassword authenticates to Redis, for quotas and everything replicas share there; empty for none.
	RedisPassword string
	RedisCluster  bool
	// InstanceID names this gateway across restarts (see quota.Options.InstanceID).
	InstanceID string
	// Region is the gateway's own region of the policy's spec.regions: the picker and the xDS clusters prefer
	// its pools and fail over in its order (docs/regions.md). Empty: every region ranks alike.
	Region string
	// SharePlacements publishes the picker's new placements to the other gateway replicas over Redis pub/sub
	// and learns theirs (the placements package), so that many replicas keep one replica's prefix affinity.
	// Without Redis it does nothing.
	SharePlacements bool
	// RelayScrapes lets one gateway replica scrape the engines for all of them (a lease in Redis, the readings
	// over pub/sub; the relay package): the engines' scrape load grows with the engines, not replicas ×
	// engines. Without Redis or scraping it does nothing.
	RelayScrapes bool
	// RedisMessageKeyFile holds the key (shared by every replica, e.g. a Secret) that signs the placements,
	// relayed readings and rollout states replicas share over Redis; empty: unsigned, and any Redis client can
	// forge them.
	RedisMessageKeyFile string
	// ScrapeInterval is how often engines' metrics are read; 0: routing on in-flight counts only.
	ScrapeInterval time.Duration
	// SecretNodes are the Envoy node ids that may receive managed-API keys over SDS.
	SecretNodes []string
	Logger      *slog.Logger
	// OnSettle receives every routed request's settlement (tests).
	OnSettle func(director.Settlement)
	// Tracing, when set, traces every request (see telemetry.TracingFromEnv); Close shuts it down.
	Tracing *telemetry.Tracing
	// AuditLog is where the audit log goes: "" off, "-" standard output, otherwise a folder of per-tenant
	// files rotated at AuditMaxFileBytes (default 64 MiB) and kept per the policy's audit retention.
	AuditLog          string
	AuditMaxFileBytes int64
	// AuditKeyFile holds the key the audit log's digests are made under (see audit.DigestKey); empty: a random
	// key for this process, whose digests no one can check once it ends.
	AuditKeyFile string
	// AuditOut replaces standard output for AuditLog "-" (tests).
	AuditOut io.Writer
	// RolloutInterval is how often rollouts' gates are judged and their shared state read (default 1 s).
	RolloutInterval time.Duration
	// Kubernetes is the EndpointSlice API that pools naming a Service are discovered with; nil: a discovery/v1
	// client built from Kubeconfig, or from the pod's service account when Kubeconfig is empty, once a pool
	// names a Service.
	Kubernetes discoveryclient.EndpointSlicesGetter
	Kubeconfig string
}

// Gateway is the built graph.
type Gateway struct {
	Policies *policies.Store
	Registry *prometheus.Registry
	Quotas   *quota.Limiter // nil without Redis
	Scraper  *fleet.Scraper
	ExtProc  *extproc.Server
	XDS      *xds.Server
	Hook     *xds.EnvoyGatewayHook
	Audit    *audit.Log // nil when off
	// Rollouts runs the policy's rollouts (its Handler is serve's admin endpoint).
	Rollouts *rollout.Controller
	// Autoscaler computes each pool's desired replicas (a collector and a settle observer).
	Autoscaler *capacity.Autoscaler
	// Placements carries the picker's placements to and from the other gateway replicas; nil unless
	// Config.SharePlacements and Redis.
	Placements *placements.Bus
	// Relay shares the engines' readings between replicas; nil unless Config.RelayScrapes, scraping and Redis.
	Relay *relay.Relay

	stopQuotas context.CancelFunc
	redis      redis.UniversalClient // the rollouts' state store and the placements' bus, nil without Redis
	// stopRollouts ends the rollout controller's loop, which closes rolloutsDone.
	stopRollouts context.CancelFunc
	rolloutsDone chan struct{}
	tracing      *telemetry.Tracing
	log          *slog.Logger
}

// Build loads the policy and wires every component; background work (scraping, the fleet-state refresh of
// xDS, the policy watch) runs until ctx ends. The quota store outlives ctx until Close, so that requests
// finishing during a drain still settle.
//
// It goes in three steps, so that a reordering cannot silently switch a feature off: construct each component
// from the values it needs (a component another needs is an argument or a return value, never a side effect
// of an earlier call), wire the listeners that close the loops between them, then start the loops.
func Build(ctx context.Context, c Config) (*Gateway, error) {
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	store, err := policies.NewStore(c.PolicyPath, log)
	if err != nil {
		return nil, err
	}
	log.Info("policy loaded", "path", c.PolicyPath, "version", store.Current().Version)
	if err := checkRegion(store.Current(), c.Region, log); err != nil {
		return nil, err
	}
	if err := discover(ctx, c, store, log); err != nil {
		return nil, err
	}
	g := &Gateway{Policies: store, Registry: prometheus.NewRegistry(), tracing: c.Tracing, log: log}
	g.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerPolicyMetrics(g.Registry, store)

	// Construct.
	admit := g.quotas(ctx, c)
	queue := admission.New(nil, admission.NewMetrics(g.Registry))
	sealer, err := g.messageSealer(c)
	if err != nil {
		g.Close()
		return nil, err
	}
	engines := g.scraper(ctx, c, queue, sealer)
	inflight := &fleet.InFlight{}
	g.Registry.MustRegister(&telemetry.FleetCollector{Policies: store, Engines: engines, InFlight: inflight})
	auditLog, digestKey, err := g.auditLog(c)
	if err != nil {
		g.Close()
		return nil, err
	}
	g.Autoscaler, g.Rollouts = g.autoscaler(engines), g.rollouts(c, engines, sealer)
	pick := g.picker(ctx, c, inflight, engines, sealer)
	// Shadow copies are settled with the rollout's gates and the audit log only: no tenant is charged for them.
	shadowObs := []director.SettleObserver{g.Rollouts}
	if auditLog != nil {
		shadowObs = append(shadowObs, auditLog)
	}
	metrics := telemetry.NewMetrics(g.Registry)
	metrics.Region = c.Region
	dir := director.New(director.Options{Policies: store, Picker: pick, InFlight: inflight, Admission: admit,
		Metrics: director.NewMetrics(g.Registry), Logger: log, Queue: queue, Rollouts: g.Rollouts,
		Shadows: shadow.New(shadow.Options{Observers: shadowObs, Registry: g.Registry, Tracing: c.Tracing,
			Pairs: g.Rollouts.ShadowPair}),
		Observers: observers(c, metrics, g.Autoscaler, g.Rollouts, auditLog)})
	g.ExtProc = extproc.New(extproc.Options{Policies: store, Director: dir, Logger: log, Tracing: c.Tracing,
		DigestKey: digestKey})
	state := rolloutFleet{state: scrapedFleet(engines), shares: g.Rollouts}
	g.XDS = xds.NewServer(log)
	g.XDS.Region = c.Region
	g.XDS.AllowSecrets(c.SecretNodes...)
	if err := g.XDS.Update(store.Current(), state); err != nil {
		g.Close()
		return nil, fmt.Errorf("initial xDS snapshot: %w", err)
	}
	g.Hook = &xds.EnvoyGatewayHook{Policy: store.Current, Fleet: state}

	// Wire: a reload and a rollout's share move push xDS.
	push := func(snap *policies.Snapshot) { g.refreshXDS(log, snap, state) }
	store.OnChange(push)
	g.Rollouts.OnShareChange(func() { push(store.Current()) }) // the gRPC routes' weights follow the shares

	// Start.
	if c.ScrapeInterval > 0 {
		// Weights and health follow the fleet; hysteresis inside Update keeps routes from flapping, and an
		// unchanged snapshot is not pushed.
		go every(ctx, 5*time.Second, func() { push(store.Current()) })
	}
	g.runRollouts(ctx, c)
	go func() {
		if err := store.Watch(ctx, 200*time.Millisecond); err != nil {
			log.Error("policy watch stopped; reload with SIGHUP", "err", err)
		}
	}()
	return g, nil
}

// quotas connects the quota store when there is Redis; the admission stage it returns is nil otherwise (never
// a nil *quota.Limiter in the interface).
func (g *Gateway) quotas(ctx context.Context, c Config) director.Admission {
	quotaCtx, stopQuotas := context.WithCancel(context.Background())
	g.stopQuotas = stopQuotas
	if len(c.RedisAddrs) == 0 {
		g.log.Warn("no Redis: tenant quotas are not enforced")
		return nil
	}
	g.Quotas = quota.New(quotaCtx, quota.Options{Addrs: c.RedisAddrs, Cluster: c.RedisCluster || len(c.RedisAddrs) > 1, Password: c.RedisPassword,
		Logger: g.log, Registerer: g.Registry, InstanceID: c.InstanceID})
	g.reclaim(ctx, g.log)
	g.log.Info("tenant quotas enforced in Redis", "redis_addrs", len(c.RedisAddrs), "fail_mode", g.Policies.Current().QuotaSettings().FailMode)
	return g.Quotas
}

// scraper reads every pool endpoint's engine metrics in its engine's dialect, refreshed when the policy
// changes, and kicks the admission queue after each round; without scraping it returns nil (routing on
// in-flight counts only).
func (g *Gateway) scraper(ctx context.Context, c Config, queue *admission.Queue, sealer *pubsub.Sealer) picker.EngineView {
	store := g.Policies
	g.Scraper = &fleet.Scraper{Interval: c.ScrapeInterval, OnRound: queue.KickAll}
	g.Scraper.SetTargets(scrapeTargets(store.Current()))
	store.OnChange(func(snap *policies.Snapshot) { g.Scraper.SetTargets(scrapeTargets(snap)) })
	if c.ScrapeInterval <= 0 {
		return nil
	}
	g.relayScrapes(ctx, c, sealer)
	go g.Scraper.Run(ctx)
	// The first requests are not routed on no data at all (they would all find the fleet stale).
	select {
	case <-g.Scraper.FirstRound():
	case <-time.After(2*c.ScrapeInterval + time.Second):
	case <-ctx.Done():
	}
	return g.Scraper
}

// scrapedFleet is the fleet state xDS reads: the scraper's, or nil (every endpoint healthy and idle).
func scrapedFleet(engines picker.EngineView) xds.FleetState {
	if s, ok := engines.(*fleet.Scraper); ok {
		return xds.ScrapedFleet{View: s}
	}
	return nil
}

// autoscaler computes each pool's desired replicas (infergate_pool_desired_replicas) from the engines and the
// settlements' TTFT p95.
func (g *Gateway) autoscaler(engines picker.EngineView) *capacity.Autoscaler {
	var view capacity.EngineView
	if engines != nil {
		view = engines
	}
	a := capacity.NewAutoscaler(g.Policies, view, nil)
	g.Registry.MustRegister(a)
	return a
}

// runRollouts starts the rollout controller's loop; Close stops it.
func (g *Gateway) runRollouts(ctx context.Context, c Config) {
	rctx, stopRollouts := context.WithCancel(ctx)
	g.rolloutsDone = make(chan struct{})
	g.stopRollouts = stopRollouts
	go func() {
		defer close(g.rolloutsDone)
		g.Rollouts.Run(rctx, cmp.Or(c.RolloutInterval, time.Second))
	}()
}

// Close stops the quota store after its last settlements went out, and flushes the audit log and the traces;
// call it once the drain is over.
func (g *Gateway) Close() {
	g.stopQuotas()
	if g.stopRollouts != nil {
		g.stopRollouts()
		<-g.rolloutsDone
	}
	if g.redis != nil {
		_ = g.redis.Close()
	}
	if g.Audit != nil {
		if err := g.Audit.Close(); err != nil {
			g.log.Warn("audit log did not close cleanly", "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.tracing.Shutdown(ctx); err != nil {
		g.log.Warn("traces still queued were not exported", "err", err)
	}
}

// auditLog opens the audit log and loads its digest key when the configuration asks for one (nil otherwise).
func (g *Gateway) auditLog(c Config) (*audit.Log, *audit.DigestKey, error) {
	if c.AuditLog == "" {
		return nil, nil, nil
	}
	key := audit.EphemeralDigestKey()
	if c.AuditKeyFile != "" {
		var err error
		if key, err = audit.LoadDigestKey(c.AuditKeyFile); err != nil {
			return nil, nil, fmt.Errorf("audit digest key: %w", err)
		}
	} else {
		g.log.Warn("audit log digests are keyed with a random key of this process: no one can check them once it ends; set --audit-key-file")
	}
	o := audit.Options{MaxFileBytes: c.AuditMaxFileBytes, Registerer: g.Registry, Logger: g.log,
		Retention: func(tenant string) time.Duration { return g.Policies.Current().AuditRetention(tenant) }}
	if c.AuditLog == "-" {
		o.Out = cmp.Or[io.Writer](c.AuditOut, os.Stdout)
	} else {
		o.Dir = c.AuditLog
	}
	a, err := audit.New(o)
	if err != nil {
		return nil, nil, fmt.Errorf("audit log: %w", err)
	}
	g.Audit = a
	g.log.Info("audit log on", "to", c.AuditLog, "digest_key", key.ID)
	return a, key, nil
}

// observers are the settle observers: the goodput metrics, the autoscaling signal, the rollouts' gates, the
// audit log when on, and the configuration's OnSettle hook.
func observers(c Config, goodput *telemetry.Metrics, scale *capacity.Autoscaler, gates *rollout.Controller, auditLog *audit.Log) []director.SettleObserver {
	obs := []director.SettleObserver{goodput}
	if auditLog != nil {
		obs = append(obs, auditLog)
	}
	obs = append(obs, scale, gates)
	if c.OnSettle != nil {
		obs = append(obs, director.OnRouted(c.OnSettle))
	}
	return obs
}

// discover starts watching the EndpointSlices of the Services the policy's pools name, when any does.
func discover(ctx context.Context, c Config, store *policies.Store, log *slog.Logger) error {
	if !store.Current().HasServices() {
		store.OnChange(func(snap *policies.Snapshot) {
			if snap.HasServices() {
				log.Error("the policy now names a Kubernetes Service for a pool, but discovery was not started: restart infergate to discover its endpoints")
			}
		})
		return nil
	}
	client := c.Kubernetes
	if client == nil {
		cfg, err := kubeConfig(c.Kubeconfig)
		if err != nil {
			return fmt.Errorf("a pool names a Kubernetes Service, so infergate needs the Kubernetes API: %w", err)
		}
		if client, err = discoveryclient.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
	}
	if err := discovery.New(client, store, log).Start(ctx); err != nil {
		return err
	}
	log.Info("pool endpoints discovered from Kubernetes EndpointSlices", "services", len(store.Current().Services()))
	return nil
}

// kubeConfig is the API server configuration: the file's, or the pod's service account's.
func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return rest.InClusterConfig()
}

// rollouts builds the controller of the policy's rollouts, its state shared in Redis when there is one.
func (g *Gateway) rollouts(c Config, engines picker.EngineView, sealer *pubsub.Sealer) *rollout.Controller {
	o := rollout.Options{Policies: g.Policies, Metrics: rollout.NewMetrics(g.Registry), Logger: g.log}
	if engines != nil {
		o.Engines = engines
	}
	if client := g.sharedRedis(c); client != nil {
		o.Store = rollout.NewRedisStore(client)
		if sealer != nil {
			o.Store = rollout.NewSealedStore(o.Store, sealer, o.Metrics.Forged)
		}
	}
	warn := func(snap *policies.Snapshot) {
		if o.Store == nil && snap.HasRollouts() {
			g.log.Warn("rollout state is kept in this process only: without Redis no other gateway replica shares it, and a restart starts every rollout over from its compatibility gate")
		}
	}
	warn(g.Policies.Current())
	g.Policies.OnChange(warn)
	return rollout.New(o)
}

// messageSealer loads the key that signs the messages replicas exchange over Redis; nil (unsigned, with a
// warning when they exchange any) without one.
func (g *Gateway) messageSealer(c Config) (*pubsub.Sealer, error) {
	if c.RedisMessageKeyFile != "" {
		s, err := pubsub.LoadSealer(c.RedisMessageKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis message key: %w", err)
		}
		return s, nil
	}
	if len(c.RedisAddrs) > 0 {
		g.log.Warn("placements, engine readings and rollout states go between replicas over Redis unsigned: any Redis client can forge them; set --redis-message-key-file")
	}
	return nil, nil
}

// sharedRedis is the client of the rollouts' state and the placements' bus (the quotas keep their own), made
// on first use; nil without Redis.
func (g *Gateway) sharedRedis(c Config) redis.UniversalClient {
	if g.redis == nil && len(c.RedisAddrs) > 0 {
		g.redis = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: c.RedisAddrs, IsClusterMode: c.RedisCluster || len(c.RedisAddrs) > 1,
			Password: c.RedisPassword})
	}
	return g.redis
}

// relayScrapes lets the replica holding the relay lease scrape for all, when RelayScrapes is on and there is
// Redis.
func (g *Gateway) relayScrapes(ctx context.Context, c Config, sealer *pubsub.Sealer) {
	client := g.sharedRedis(c)
	if !c.RelayScrapes || client == nil {
		return
	}
	g.Relay = relay.New(relay.Options{Client: client, Scraper: g.Scraper, Interval: c.ScrapeInterval,
		Metrics: relay.NewMetrics(g.Registry), Logger: g.log, Sealer: sealer, Region: c.Region})
	g.Scraper.Relay = g.Relay
	go g.Relay.Run(ctx)
	g.log.Info("engine readings relayed between gateway replicas over Redis: one replica scrapes for all", "channel", relay.ChannelFor(c.Region))
}

// picker builds the gateway's one picker: prefix affinity over the policy store, the in-flight counts and the
// engines, publishing its placements to the other gateway replicas and learning theirs until ctx ends when
// SharePlacements is on and there is Redis.
func (g *Gateway) picker(ctx context.Context, c Config, inflight *fleet.InFlight, engines picker.EngineView, sealer *pubsub.Sealer) picker.Picker {
	a := picker.ForStore(g.Policies, inflight, engines)
	a.Metrics = picker.NewMetrics(g.Registry)
	a.Region = c.Region
	client := g.sharedRedis(c)
	if !c.SharePlacements || client == nil {
		return a
	}
	g.Placements = placements.New(placements.Options{Client: client, Metrics: placements.NewMetrics(g.Registry), Logger: g.log,
		Sealer: sealer})
	a.Placements = g.Placements
	go g.Placements.Run(ctx, a.Learn)
	g.log.Info("placements shared with the other gateway replicas over Redis pub/sub", "channel", placements.Channel)
	return a
}

// rolloutFleet is the fleet state with the rollouts' shares, which weight the proxyless gRPC routes.
type rolloutFleet struct {
	state  xds.FleetState // nil without scraping: every endpoint healthy and idle
	shares *rollout.Controller
}

// Endpoint implements xds.FleetState.
func (r rolloutFleet) Endpoint(addr string) (xds.EndpointState, bool) {
	if r.state == nil {
		return xds.EndpointState{}, false
	}
	return r.state.Endpoint(addr)
}

// Share implements xds.RolloutShares.
func (r rolloutFleet) Share(model string) float64 { return r.shares.Share(model) }

// ShadowShare implements director.Rollouts.
func (r rolloutFleet) ShadowShare(model string) float64 { return r.shares.ShadowShare(model) }

// ArmSeed implements director.Rollouts.
func (r rolloutFleet) ArmSeed(model string) uint64 { return r.shares.ArmSeed(model) }

func (g *Gateway) reclaim(ctx context.Context, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := g.Quotas.Reclaim(rctx, g.Policies.Current()); err != nil {
		log.Warn("could not reclaim the previous run's concurrency slots; they free on their own within seconds", "err", err)
	} else if n > 0 {
		log.Info("reclaimed concurrency slots of this instance's previous run", "slots", n)
	}
}

func (g *Gateway) refreshXDS(log *slog.Logger, snap *policies.Snapshot, state xds.FleetState) {
	if err := g.XDS.Update(snap, state); err != nil {
		log.Error("xds update rejected; Envoy keeps the previous snapshot", "err", err)
	}
}

// every calls fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// scrapeTargets lists every pool endpoint with its engine's metrics dialect. Validation refuses an engine
// with no dialect, so a snapshot holds none; were one to slip through, its pool is not scraped (its endpoints
// have no fresh readings and count as saturated) rather than read with another engine's metric names.
func scrapeTargets(snap *policies.Snapshot) []fleet.Target {
	var out []fleet.Target
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			d, ok := fleet.DialectFor(p.Engine)
			if !ok {
				continue
			}
			for _, ep := range p.Endpoints {
				out = append(out, fleet.Target{Addr: ep, Dialect: d})
			}
		}
	}
	return out
}

// checkRegion refuses a region the policy does not have (the gateway would rank every region alike without
// saying so), and warns of a policy with regions served without one.
func checkRegion(snap *policies.Snapshot, region string, log *slog.Logger) error {
	switch {
	case region != "" && snap.Regional() && snap.RegionOrder(region) == nil:
		return fmt.Errorf("--region %q is not one of the policy's spec.regions", region)
	case region != "" && !snap.Regional():
		log.Warn("the policy has no regions: --region is ignored until it has", "region", region)
	case region == "" && snap.Regional():
		log.Warn("the policy has regions but this gateway names none (--region): every region ranks alike")
	}
	return nil
}
