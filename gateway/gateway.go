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
	"k8s.io/client-go/kubernetes"
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
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/relay"
	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/telemetry"
	"github.com/infergate/infergate/xds"
)

// Config is what the graph is built from.
type Config struct {
	PolicyPath string
	// RedisAddrs enforce tenants' quotas (one address, or several for Redis Cluster); none: no quotas.
	RedisAddrs   []string
	RedisCluster bool
	// InstanceID names this gateway across restarts (see quota.Options.InstanceID).
	InstanceID string
	// SharePlacements publishes the picker's new placements to the other gateway replicas over Redis pub/sub
	// and learns theirs (the placements package), so that many replicas keep one replica's prefix affinity.
	// Without Redis it does nothing.
	SharePlacements bool
	// RelayScrapes lets one gateway replica scrape the engines for all of them (a lease in Redis, the readings
	// over pub/sub; the relay package): the engines' scrape load grows with the engines, not replicas ×
	// engines. Without Redis or scraping it does nothing.
	RelayScrapes bool
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
	// AuditOut replaces standard output for AuditLog "-" (tests).
	AuditOut io.Writer
	// RolloutInterval is how often rollouts' gates are judged and their shared state read (default 1 s).
	RolloutInterval time.Duration
	// Kubernetes is the API client that pools naming a Service are discovered with; nil: built from
	// Kubeconfig, or from the pod's service account when Kubeconfig is empty, once a pool names a Service.
	Kubernetes kubernetes.Interface
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
	if err := discover(ctx, c, store, log); err != nil {
		return nil, err
	}
	g := &Gateway{Policies: store, Registry: prometheus.NewRegistry(), tracing: c.Tracing, log: log}
	g.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerPolicyMetrics(g.Registry, store)
	metrics := extproc.NewMetrics(g.Registry)

	quotaCtx, stopQuotas := context.WithCancel(context.Background())
	g.stopQuotas = stopQuotas
	if len(c.RedisAddrs) > 0 {
		g.Quotas = quota.New(quotaCtx, quota.Options{Addrs: c.RedisAddrs, Cluster: c.RedisCluster || len(c.RedisAddrs) > 1,
			Logger: log, Registerer: g.Registry, InstanceID: c.InstanceID})
		g.reclaim(ctx, log)
		log.Info("tenant quotas enforced in Redis", "redis_addrs", len(c.RedisAddrs), "fail_mode", store.Current().QuotaSettings().FailMode)
	} else {
		log.Warn("no Redis: tenant quotas are not enforced")
	}

	// Engine metrics: every pool endpoint in its engine's dialect, refreshed when the policy changes.
	queue := admission.New(nil, admission.NewMetrics(g.Registry))
	g.Scraper = &fleet.Scraper{Interval: c.ScrapeInterval, OnRound: queue.KickAll}
	g.Scraper.SetTargets(scrapeTargets(store.Current()))
	store.OnChange(func(snap *policies.Snapshot) { g.Scraper.SetTargets(scrapeTargets(snap)) })
	var engines picker.EngineView
	var state xds.FleetState
	if c.ScrapeInterval > 0 {
		g.relayScrapes(ctx, c)
		go g.Scraper.Run(ctx)
		engines, state = g.Scraper, xds.ScrapedFleet{View: g.Scraper}
		// The first requests are not routed on no data at all (they would all find the fleet stale).
		select {
		case <-g.Scraper.FirstRound():
		case <-time.After(2*c.ScrapeInterval + time.Second):
		case <-ctx.Done():
		}
	}
	observers, err := g.telemetry(c)
	if err != nil {
		g.Close()
		return nil, err
	}
	inflight := &fleet.InFlight{}
	g.Registry.MustRegister(&telemetry.FleetCollector{Policies: store, Engines: engines, InFlight: inflight})
	// The autoscaling signal (infergate_pool_desired_replicas) hears settlements for each pool's TTFT p95.
	var scaleEngines capacity.EngineView
	if engines != nil {
		scaleEngines = engines
	}
	g.Autoscaler = capacity.NewAutoscaler(store, scaleEngines, nil)
	g.Registry.MustRegister(g.Autoscaler)
	observers = append(observers, g.Autoscaler)
	g.XDS = xds.NewServer(log)
	var refresh func()
	g.rollouts(c, engines, func() { refresh() })
	observers = append(observers, g.Rollouts)
	g.ExtProc = extproc.New(extproc.Options{Policies: store, Metrics: metrics, Logger: log, Quotas: g.Quotas, Engines: engines,
		InFlight: inflight, Picker: g.sharingPicker(ctx, c, inflight, engines), OnSettle: c.OnSettle, Observers: observers, Tracing: c.Tracing, Digests: g.Audit != nil,
		Queue: queue, Rollouts: g.Rollouts})

	state = rolloutFleet{state: state, shares: g.Rollouts}
	refresh = func() { g.refreshXDS(log, store.Current(), state) }
	g.XDS.AllowSecrets(c.SecretNodes...)
	if err := g.XDS.Update(store.Current(), state); err != nil {
		g.Close()
		return nil, fmt.Errorf("initial xDS snapshot: %w", err)
	}
	store.OnChange(func(snap *policies.Snapshot) { g.refreshXDS(log, snap, state) })
	if c.ScrapeInterval > 0 {
		// Weights and health follow the fleet; hysteresis inside Update keeps routes from flapping, and an
		// unchanged snapshot is not pushed.
		go every(ctx, 5*time.Second, func() { g.refreshXDS(log, store.Current(), state) })
	}
	g.Hook = &xds.EnvoyGatewayHook{Policy: store.Current, Fleet: state}
	rctx, stopRollouts := context.WithCancel(ctx)
	g.rolloutsDone = make(chan struct{})
	g.stopRollouts = stopRollouts
	go func() {
		defer close(g.rolloutsDone)
		g.Rollouts.Run(rctx, cmp.Or(c.RolloutInterval, time.Second))
	}()

	go func() {
		if err := store.Watch(ctx, 200*time.Millisecond); err != nil {
			log.Error("policy watch stopped; reload with SIGHUP", "err", err)
		}
	}()
	return g, nil
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

// telemetry builds the settle observers: the goodput metrics and, when configured, the audit log.
func (g *Gateway) telemetry(c Config) ([]director.SettleObserver, error) {
	obs := []director.SettleObserver{telemetry.NewMetrics(g.Registry)}
	if c.AuditLog == "" {
		return obs, nil
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
		return nil, fmt.Errorf("audit log: %w", err)
	}
	g.Audit = a
	g.log.Info("audit log on", "to", c.AuditLog)
	return append(obs, a), nil
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
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
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
// onShareChange pushes xDS again (the gRPC routes' weights follow the shares).
func (g *Gateway) rollouts(c Config, engines picker.EngineView, onShareChange func()) {
	o := rollout.Options{Policies: g.Policies, Metrics: rollout.NewMetrics(g.Registry), Logger: g.log, OnShareChange: onShareChange}
	if engines != nil {
		o.Engines = engines
	}
	if client := g.sharedRedis(c); client != nil {
		o.Store = rollout.NewRedisStore(client)
	}
	g.Rollouts = rollout.New(o)
	warn := func(snap *policies.Snapshot) {
		if o.Store == nil && snap.HasRollouts() {
			g.log.Warn("rollout state is kept in this process only: without Redis no other gateway replica shares it, and a restart starts every rollout over from its compatibility gate")
		}
	}
	warn(g.Policies.Current())
	g.Policies.OnChange(warn)
}

// sharedRedis is the client of the rollouts' state and the placements' bus (the quotas keep their own), made
// on first use; nil without Redis.
func (g *Gateway) sharedRedis(c Config) redis.UniversalClient {
	if g.redis == nil && len(c.RedisAddrs) > 0 {
		g.redis = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: c.RedisAddrs, IsClusterMode: c.RedisCluster || len(c.RedisAddrs) > 1})
	}
	return g.redis
}

// relayScrapes lets the replica holding the relay lease scrape for all, when RelayScrapes is on and there is
// Redis.
func (g *Gateway) relayScrapes(ctx context.Context, c Config) {
	client := g.sharedRedis(c)
	if !c.RelayScrapes || client == nil {
		return
	}
	g.Relay = relay.New(relay.Options{Client: client, Scraper: g.Scraper, Interval: c.ScrapeInterval,
		Metrics: relay.NewMetrics(g.Registry), Logger: g.log})
	g.Scraper.Relay = g.Relay
	go g.Relay.Run(ctx)
	g.log.Info("engine readings relayed between gateway replicas over Redis: one replica scrapes for all", "channel", relay.Channel)
}

// sharingPicker is the prefix-affinity picker publishing its placements to the other gateway replicas and
// learning theirs until ctx ends, when SharePlacements is on and there is Redis; otherwise nil, the
// director's default picker.
func (g *Gateway) sharingPicker(ctx context.Context, c Config, inflight *fleet.InFlight, engines picker.EngineView) picker.Picker {
	client := g.sharedRedis(c)
	if !c.SharePlacements || client == nil {
		return nil
	}
	a := picker.NewAffinity(inflight, engines)
	a.PolicyChanged(g.Policies.Current())
	g.Policies.OnChange(a.PolicyChanged) // replicas removed from the policy leave the index, and are not learnt
	g.Placements = placements.New(placements.Options{Client: client, Metrics: placements.NewMetrics(g.Registry), Logger: g.log})
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

// scrapeTargets lists every pool endpoint with its engine's metrics dialect.
func scrapeTargets(snap *policies.Snapshot) []fleet.Target {
	var out []fleet.Target
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			for _, ep := range p.Endpoints {
				out = append(out, fleet.Target{Addr: ep, Dialect: fleet.DialectFor(p.Engine)})
			}
		}
	}
	return out
}
