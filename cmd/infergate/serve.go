package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	egextension "github.com/envoyproxy/gateway/proto/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/xds"
)

// defaultGCPercent is the GOGC serve runs with unless the environment sets one (see BENCHMARKS.md).
const defaultGCPercent = 400

type serveConfig struct {
	policy         string
	extprocAddr    string
	xdsAddr        string
	egAddr         string
	metricsAddr    string
	redisAddr      string
	redisCluster   bool
	logLevel       string
	drainTimeout   time.Duration
	scrapeInterval time.Duration
	tlsCert        string
	tlsKey         string
	tlsClientCA    string
	secretNodes    string
	instanceID     string
}

// serveFlags declares serve's flags into cfg (deployment files are checked against them in tests).
func serveFlags(cfg *serveConfig, stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&cfg.policy, "policy", "", "policy YAML file (required); reloaded when it changes")
	fs.StringVar(&cfg.extprocAddr, "extproc-addr", "127.0.0.1:9002", "ext_proc gRPC listen address (with the gRPC health service); loopback unless you give another")
	fs.StringVar(&cfg.xdsAddr, "xds-addr", "127.0.0.1:18000", "xDS (ADS) gRPC listen address; empty disables it")
	fs.StringVar(&cfg.egAddr, "envoy-gateway-addr", "", "Envoy Gateway extension server (post-translation hook) listen address, e.g. "+xds.EnvoyGatewayHookAddr+"; empty disables it")
	fs.StringVar(&cfg.metricsAddr, "metrics-addr", "127.0.0.1:9090", "Prometheus /metrics and /healthz listen address; empty disables it")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate for the gRPC listeners (ext_proc, xDS, Envoy Gateway hook); reloaded when the file changes")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: with it every gRPC client must present a certificate it signed (mTLS)")
	fs.StringVar(&cfg.secretNodes, "xds-secret-nodes", "envoy-quickstart", "comma-separated Envoy node ids that may receive managed-API keys over SDS; each must present a client certificate naming it (or connect over loopback without TLS)")
	fs.StringVar(&cfg.redisAddr, "redis-addr", "", "Redis for tenant quotas: host:port, or several comma-separated for Redis Cluster; empty disables quotas")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", false, "treat a single --redis-addr as a Redis Cluster endpoint")
	fs.StringVar(&cfg.instanceID, "instance-id", "", "this gateway's name across restarts (a pod name; letters, digits, . _ -): its quota concurrency slots carry it, and a restart frees the previous run's at once; never shared by two running gateways")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&cfg.scrapeInterval, "scrape-interval", 100*time.Millisecond, "how often engines' /metrics are read for load and saturation; 0 disables (routing then uses in-flight counts only)")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long open streams may finish before they are cut")
	return fs
}

func cmdServe(ctx context.Context, args []string, _, stderr io.Writer) int {
	var cfg serveConfig
	fs := serveFlags(&cfg, stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.policy == "" {
		fmt.Fprintln(stderr, "infergate serve: --policy is required")
		return 2
	}
	log, err := newLogger(stderr, cfg.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "infergate serve:", err)
		return 2
	}
	if !validInstanceID(cfg.instanceID) {
		fmt.Fprintln(stderr, "infergate serve: --instance-id may hold only letters, digits, '.', '_' and '-'")
		return 2
	}
	if err := serve(ctx, cfg, log); err != nil {
		var inv *policies.InvalidError
		if errors.As(err, &inv) {
			for _, p := range inv.Problems {
				fmt.Fprintln(stderr, p.String())
			}
		}
		log.Error("infergate stopped", "err", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	store, err := policies.NewStore(cfg.policy, log)
	if err != nil {
		return err
	}
	log.Info("policy loaded", "path", cfg.policy, "version", store.Current().Version)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerPolicyMetrics(reg, store)
	metrics := extproc.NewMetrics(reg)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The quota store outlives the drain, so that requests finishing during it still settle.
	quotaCtx, stopQuotas := context.WithCancel(context.Background())
	defer stopQuotas()
	var limiter *quota.Limiter
	if cfg.redisAddr != "" {
		addrs := strings.Split(cfg.redisAddr, ",")
		limiter = quota.New(quotaCtx, quota.Options{Addrs: addrs, Cluster: cfg.redisCluster || len(addrs) > 1, Logger: log,
			Registerer: reg, InstanceID: cfg.instanceID})
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		if n, err := limiter.Reclaim(rctx, store.Current()); err != nil {
			log.Warn("could not reclaim the previous run's concurrency slots; they free on their own within seconds", "err", err)
		} else if n > 0 {
			log.Info("reclaimed concurrency slots of this instance's previous run", "slots", n)
		}
		rcancel()
		log.Info("tenant quotas enforced in Redis", "redis_addrs", len(addrs), "fail_mode", store.Current().QuotaSettings().FailMode)
	} else {
		log.Warn("no --redis-addr: tenant quotas are not enforced")
	}

	// Engine metrics: every pool endpoint in its engine's dialect, refreshed when the policy changes.
	scraper := &fleet.Scraper{Interval: cfg.scrapeInterval}
	scraper.SetTargets(scrapeTargets(store.Current()))
	store.OnChange(func(snap *policies.Snapshot) { scraper.SetTargets(scrapeTargets(snap)) })
	var engines picker.EngineView
	if cfg.scrapeInterval > 0 {
		go scraper.Run(ctx)
		engines = scraper
	}

	creds, err := listenerCredentials(cfg, log)
	if err != nil {
		return err
	}
	for _, a := range []string{cfg.extprocAddr, cfg.xdsAddr, cfg.egAddr} {
		if a != "" && creds == nil && !loopbackAddr(a) {
			log.Warn("a gRPC listener binds beyond loopback without TLS: anyone who reaches it is trusted as Envoy; set --tls-cert, --tls-key and --tls-client-ca", "addr", a)
		}
	}

	extproc.InstallBufferPool()
	if os.Getenv("GOGC") == "" {
		// Every request allocates its body; with the default GOGC=100 and a small live heap the collector runs
		// every few requests and shows up in p99 decision latency. GOGC (and GOMEMLIMIT) still override this.
		debug.SetGCPercent(defaultGCPercent)
	}
	srv := extproc.New(extproc.Options{Policies: store, Metrics: metrics, Logger: log, Quotas: limiter, Engines: engines})
	gs := grpc.NewServer(append(extproc.ServerOptions(), creds...)...)
	health := srv.Register(gs)

	lis, err := net.Listen("tcp", cfg.extprocAddr)
	if err != nil {
		return fmt.Errorf("listen ext_proc on %s: %w", cfg.extprocAddr, err)
	}
	log.Info("ext_proc listening", "addr", lis.Addr().String())
	errc := make(chan error, 4)
	go func() { errc <- gs.Serve(lis) }()

	var metricsSrv *http.Server
	var draining atomic.Bool
	if cfg.metricsAddr != "" {
		mlis, err := net.Listen("tcp", cfg.metricsAddr)
		if err != nil {
			gs.Stop()
			return fmt.Errorf("listen metrics on %s: %w", cfg.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		// Readiness for probes that cannot speak the gRPC health protocol over TLS (kubelet's): 503 from the
		// moment the drain starts, like the gRPC readiness service.
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if draining.Load() {
				http.Error(w, "draining", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok\n")
		})
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		log.Info("metrics listening", "addr", mlis.Addr().String())
		go func() {
			if err := metricsSrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics server: %w", err)
			}
		}()
	}
	if cfg.xdsAddr != "" {
		cp := xds.NewServer(log)
		cp.AllowSecrets(splitList(cfg.secretNodes)...)
		var state xds.FleetState
		if engines != nil {
			state = xds.ScrapedFleet{View: scraper}
		}
		if err := cp.Update(store.Current(), nil); err != nil {
			gs.Stop()
			return err
		}
		store.OnChange(func(snap *policies.Snapshot) {
			if err := cp.Update(snap, state); err != nil {
				log.Error("xds update rejected; Envoy keeps the previous snapshot", "err", err)
			}
		})
		if state != nil {
			// Weights and health follow the fleet; hysteresis inside Update keeps routes from flapping.
			go func() {
				t := time.NewTicker(5 * time.Second)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
						if err := cp.Update(store.Current(), state); err != nil {
							log.Error("xds update rejected; Envoy keeps the previous snapshot", "err", err)
						}
					}
				}
			}()
		}
		stop, err := serveGRPC(cfg.xdsAddr, "xds", log, errc, creds, func(g *grpc.Server) { cp.Register(ctx, g) })
		if err != nil {
			gs.Stop()
			return err
		}
		defer stop()
	}

	if cfg.egAddr != "" {
		hook := &xds.EnvoyGatewayHook{Policy: store.Current}
		if engines != nil {
			hook.Fleet = xds.ScrapedFleet{View: scraper}
		}
		stop, err := serveGRPC(cfg.egAddr, "envoy gateway extension hook", log, errc, creds, func(g *grpc.Server) {
			egextension.RegisterEnvoyGatewayExtensionServer(g, hook)
		})
		if err != nil {
			gs.Stop()
			return err
		}
		defer stop()
	}

	go func() {
		if err := store.Watch(ctx, 200*time.Millisecond); err != nil {
			log.Error("policy watch stopped; reload with SIGHUP", "err", err)
		}
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	for {
		select {
		case <-hup:
			_ = store.Reload()
			continue
		case err := <-errc:
			gs.Stop()
			return err
		case <-ctx.Done():
		}
		break
	}

	// Drain: tell health checkers we are going away, let open streams (requests in flight) finish, then stop.
	draining.Store(true)
	log.Info("draining", "timeout", cfg.drainTimeout.String())
	for _, name := range extproc.HealthServices {
		health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.drainTimeout):
		log.Warn("drain timeout; closing open streams")
		gs.Stop()
		<-done
	}
	if metricsSrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		_ = metricsSrv.Shutdown(sctx)
	}
	log.Info("stopped")
	return nil
}

// scrapeTargets lists every pool endpoint with its engine's metrics dialect.
// serveGRPC listens on addr and serves the services register adds until the returned stop; a serve error goes
// to errc.
func serveGRPC(addr, what string, log *slog.Logger, errc chan<- error, opts []grpc.ServerOption, register func(*grpc.Server)) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s on %s: %w", what, addr, err)
	}
	g := grpc.NewServer(opts...)
	register(g)
	log.Info(what+" listening", "addr", lis.Addr().String())
	go func() { errc <- g.Serve(lis) }()
	return g.Stop, nil
}

// listenerCredentials returns the gRPC server option that puts the listeners behind TLS (mTLS with a
// client CA), or nothing when no certificate is configured.
func listenerCredentials(cfg serveConfig, log *slog.Logger) ([]grpc.ServerOption, error) {
	if cfg.tlsCert == "" && cfg.tlsKey == "" && cfg.tlsClientCA == "" {
		return nil, nil
	}
	files, err := newTLSFiles(cfg.tlsCert, cfg.tlsKey, cfg.tlsClientCA, log)
	if err != nil {
		return nil, err
	}
	log.Info("gRPC listeners use TLS", "client_certificates_required", cfg.tlsClientCA != "")
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(files.ServerConfig()))}, nil
}

// loopbackAddr reports whether a listen address binds only the loopback interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validInstanceID(id string) bool {
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return len(id) <= 128
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

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

// registerPolicyMetrics exposes reload results, so an alert can fire when a bad policy is being refused and
// the fleet is running on an older one.
func registerPolicyMetrics(reg prometheus.Registerer, store *policies.Store) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "infergate_policy_reloads_total", Help: "Policy reload attempts, by result (ok, rejected).",
			ConstLabels: prometheus.Labels{"result": "ok"},
		}, func() float64 { ok, _, _ := store.ReloadStats(); return float64(ok) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "infergate_policy_reloads_total", Help: "Policy reload attempts, by result (ok, rejected).",
			ConstLabels: prometheus.Labels{"result": "rejected"},
		}, func() float64 { _, failed, _ := store.ReloadStats(); return float64(failed) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_policy_last_reload_success",
			Help: "1 if the last policy load succeeded, 0 if the last attempt was rejected and an older policy is live.",
		}, func() float64 {
			if _, _, ok := store.ReloadStats(); ok {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "infergate_policy_loaded_timestamp_seconds",
			Help: "When the live policy was loaded (Unix seconds).",
		}, func() float64 { return float64(store.Current().LoadedAt.Unix()) }),
	)
}
