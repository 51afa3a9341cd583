package main

import (
	"cmp"
	"context"
	"crypto/tls"
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
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	egextension "github.com/envoyproxy/gateway/proto/extension"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/gateway"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
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
	adminAddr      string
	adminClients   string
	redisAddr      string
	redisCluster   bool
	sharePlacement bool
	relayScrapes   bool
	logLevel       string
	drainTimeout   time.Duration
	scrapeInterval time.Duration
	tlsCert        string
	tlsKey         string
	tlsClientCA    string
	secretNodes    string
	instanceID     string
	region         string
	auditLog       string
	auditMaxBytes  int64
	auditKeyFile   string
	kubeconfig     string
	traceClient    string
	traceTrusted   string
	messageKeyFile string
}

// serveFlags declares serve's flags into cfg (deployment files are checked against them in tests).
func serveFlags(cfg *serveConfig, stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&cfg.policy, "policy", "", "policy YAML file (required); reloaded when it changes")
	fs.StringVar(&cfg.extprocAddr, "extproc-addr", "127.0.0.1:9002", "ext_proc gRPC listen address (with the gRPC health service); loopback unless you give another")
	fs.StringVar(&cfg.xdsAddr, "xds-addr", "127.0.0.1:18000", "xDS (ADS) gRPC listen address; empty disables it")
	fs.StringVar(&cfg.egAddr, "envoy-gateway-addr", "", "Envoy Gateway extension server (post-translation hook) listen address, e.g. "+xds.EnvoyGatewayHookAddr+"; empty disables it")
	fs.StringVar(&cfg.metricsAddr, "metrics-addr", "127.0.0.1:9090", "Prometheus /metrics and /healthz listen address; empty disables it")
	fs.StringVar(&cfg.adminAddr, "admin-addr", "127.0.0.1:9091", "admin endpoint (rollout status and commands, for `infergate rollout`); beyond loopback only with --tls-cert, --tls-key and --tls-client-ca; empty disables it")
	fs.StringVar(&cfg.adminClients, "admin-client-names", "", "comma-separated client certificate names (common name, DNS or URI SAN) the admin endpoint answers over mutual TLS; required beyond loopback, where an Envoy's certificate from the same CA must not steer rollouts")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate for the gRPC listeners (ext_proc, xDS, Envoy Gateway hook); reloaded when the file changes")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: with it every gRPC client must present a certificate it signed (mTLS)")
	fs.StringVar(&cfg.secretNodes, "xds-secret-nodes", "envoy-quickstart", "comma-separated Envoy node ids that may receive managed-API keys over SDS; each must present a client certificate naming it (or connect over loopback without TLS)")
	fs.StringVar(&cfg.redisAddr, "redis-addr", "", "Redis for tenant quotas: host:port, or several comma-separated for Redis Cluster; empty disables quotas")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", false, "treat a single --redis-addr as a Redis Cluster endpoint")
	fs.BoolVar(&cfg.relayScrapes, "relay-scrapes", true, "with --redis-addr, let one gateway replica (a lease in Redis) scrape the engines for all and relay the readings over pub/sub; the others scrape themselves whenever the relay is two intervals late")
	fs.StringVar(&cfg.messageKeyFile, "redis-message-key-file", "", "file holding the key (32 bytes or more, the same for every replica, e.g. a mounted Secret) that signs the placements, engine readings and rollout states replicas share over Redis; unsigned or stale ones are then dropped and counted. Empty: unsigned, and any Redis client can forge them")
	fs.BoolVar(&cfg.sharePlacement, "share-placements", true, "with --redis-addr, tell the other gateway replicas over Redis pub/sub where this one starts each conversation group, and learn theirs, so that many replicas keep one replica's prefix affinity (and, under SLO placement, the long prompts each sends, for the prefill ahead at each engine)")
	fs.StringVar(&cfg.instanceID, "instance-id", "", "this gateway's name across restarts (a pod name; letters, digits, . _ -): its quota concurrency slots carry it, and a restart frees the previous run's at once; never shared by two running gateways")
	fs.StringVar(&cfg.region, "region", "", "this gateway's region (one of the policy's spec.regions): its pools first, then the region's failover order; the xDS clusters fail over in the same order. Empty: every region ranks alike")
	fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig for discovering pools that name a Kubernetes Service (their EndpointSlices); empty: the pod's service account")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&cfg.auditLog, "audit-log", "", "audit log of settled requests (JSON lines with digests, never text or keys): a folder of per-tenant files, or - for standard output; empty disables it")
	fs.StringVar(&cfg.traceClient, "client-trace-context", telemetry.ClientContextHonour, "whose traceparent makes a request's span its child and, under a parentbased_ sampler, decides its sampling: honour (every client's), ignore (none: the sampler alone decides, the client's context is linked), trusted (only from --trace-trusted-sources)")
	fs.StringVar(&cfg.traceTrusted, "trace-trusted-sources", "", "comma-separated addresses or CIDR prefixes (Envoy's source.address) whose traceparent counts under --client-trace-context=trusted")
	fs.StringVar(&cfg.auditKeyFile, "audit-key-file", "", "file holding the key (32 bytes or more, e.g. a mounted Secret) the audit log's prompt and output digests are HMACs under; empty: a random key per process, whose digests no one can check once it ends")
	fs.Int64Var(&cfg.auditMaxBytes, "audit-max-file-bytes", 64<<20, "size at which a tenant's audit file is rotated; rotated files are kept per the policy's audit retention")
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gc := gateway.Config{PolicyPath: cfg.policy, RedisCluster: cfg.redisCluster, InstanceID: cfg.instanceID, Region: cfg.region, SharePlacements: cfg.sharePlacement,
		RelayScrapes: cfg.relayScrapes, RedisMessageKeyFile: cfg.messageKeyFile,
		ScrapeInterval: cfg.scrapeInterval, SecretNodes: splitList(cfg.secretNodes), Logger: log}
	// The password comes from the environment (a Secret), never a flag: flags show in process listings.
	gc.RedisPassword = os.Getenv("INFERGATE_REDIS_PASSWORD")
	if cfg.redisAddr != "" {
		gc.RedisAddrs = strings.Split(cfg.redisAddr, ",")
	}
	gc.AuditLog, gc.AuditMaxFileBytes, gc.AuditKeyFile, gc.Kubeconfig = cfg.auditLog, cfg.auditMaxBytes, cfg.auditKeyFile, cfg.kubeconfig
	clientContext, err := telemetry.ParseClientContext(cfg.traceClient, cfg.traceTrusted)
	if err != nil {
		return err
	}
	tracing, err := telemetry.TracingFromEnv(ctx, buildVersion())
	if err != nil {
		return err
	}
	tracing = tracing.WithClientContext(clientContext)
	if tracing != nil {
		log.Info("traces exported over OTLP", "endpoint", cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")),
			"sampler", cmp.Or(os.Getenv("OTEL_TRACES_SAMPLER"), "parentbased_always_on"), "sampler_arg", os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	} else {
		log.Info("traces off; set OTEL_EXPORTER_OTLP_ENDPOINT to export them")
	}
	gc.Tracing = tracing
	g, err := gateway.Build(ctx, gc)
	if err != nil {
		return err
	}
	defer g.Close() // after the drain: requests finishing during it still settle
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
	gs := grpc.NewServer(append(extproc.ServerOptions(), creds...)...)
	health := g.ExtProc.Register(gs)
	lis, err := net.Listen("tcp", cfg.extprocAddr)
	if err != nil {
		return fmt.Errorf("listen ext_proc on %s: %w", cfg.extprocAddr, err)
	}
	log.Info("ext_proc listening", "addr", lis.Addr().String())
	errc := make(chan error, 4)
	go func() { errc <- gs.Serve(lis) }()
	var draining atomic.Bool
	metricsSrv, stops, err := serveSide(ctx, cfg, log, g, creds, &draining, errc)
	for _, stop := range stops {
		defer stop()
	}
	if err != nil {
		gs.Stop()
		return err
	}
	if err := waitForStop(ctx, g, errc); err != nil {
		gs.Stop()
		return err
	}
	drain(cfg, log, gs, health, &draining, metricsSrv)
	return nil
}

// serveSide starts the metrics endpoint, the xDS server and the Envoy Gateway hook, as configured; it returns
// the metrics server (nil when off) and the stop functions of the gRPC ones.
func serveSide(ctx context.Context, cfg serveConfig, log *slog.Logger, g *gateway.Gateway, creds []grpc.ServerOption,
	draining *atomic.Bool, errc chan<- error) (*http.Server, []func(), error) {
	var stops []func()
	var metricsSrv *http.Server
	if cfg.metricsAddr != "" {
		srv, err := serveMetrics(cfg.metricsAddr, log, g.Registry, draining, errc)
		if err != nil {
			return nil, stops, err
		}
		metricsSrv = srv
	}
	if cfg.adminAddr != "" {
		stop, err := serveAdmin(cfg, log, g.Rollouts.Handler(), errc)
		if err != nil {
			return metricsSrv, stops, err
		}
		stops = append(stops, stop)
	}
	if cfg.xdsAddr != "" {
		stop, err := serveGRPC(cfg.xdsAddr, "xds", log, errc, creds, func(gsrv *grpc.Server) { g.XDS.Register(ctx, gsrv) })
		if err != nil {
			return metricsSrv, stops, err
		}
		stops = append(stops, stop)
	}
	if cfg.egAddr != "" {
		stop, err := serveGRPC(cfg.egAddr, "envoy gateway extension hook", log, errc, creds, func(gsrv *grpc.Server) {
			egextension.RegisterEnvoyGatewayExtensionServer(gsrv, g.Hook)
		})
		if err != nil {
			return metricsSrv, stops, err
		}
		stops = append(stops, stop)
	}
	return metricsSrv, stops, nil
}

// serveMetrics serves /metrics, /healthz and /readyz on addr.
func serveMetrics(addr string, log *slog.Logger, reg *prometheus.Registry, draining *atomic.Bool, errc chan<- error) (*http.Server, error) {
	mlis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen metrics on %s: %w", addr, err)
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
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("metrics listening", "addr", mlis.Addr().String())
	go func() {
		if err := srv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("metrics server: %w", err)
		}
	}()
	return srv, nil
}

// serveAdmin serves the admin endpoint: on loopback as it is, beyond loopback only behind mutual TLS, since
// whoever reaches it can promote or abort a rollout. With --tls-cert it is TLS wherever it binds.
func serveAdmin(cfg serveConfig, log *slog.Logger, h http.Handler, errc chan<- error) (func(), error) {
	remote := !loopbackAddr(cfg.adminAddr)
	names := splitList(cfg.adminClients)
	if remote && (cfg.tlsCert == "" || cfg.tlsClientCA == "" || len(names) == 0) {
		return nil, fmt.Errorf("the admin endpoint %s binds beyond loopback: give --tls-cert, --tls-key, --tls-client-ca and --admin-client-names so that only the operators' certificates reach it, or bind it to loopback", cfg.adminAddr)
	}
	if len(names) > 0 && cfg.tlsClientCA == "" {
		return nil, errors.New("--admin-client-names needs --tls-client-ca: without client certificates there are no names to check")
	}
	h = adminGuard(h, !remote && cfg.tlsCert == "", names)
	lis, err := net.Listen("tcp", cfg.adminAddr)
	if err != nil {
		return nil, fmt.Errorf("listen admin on %s: %w", cfg.adminAddr, err)
	}
	if cfg.tlsCert != "" {
		files, err := newTLSFiles(cfg.tlsCert, cfg.tlsKey, cfg.tlsClientCA, log)
		if err != nil {
			_ = lis.Close()
			return nil, err
		}
		lis = tls.NewListener(lis, http1Config(files.ServerConfig()))
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Info("admin listening", "addr", lis.Addr().String(), "tls", cfg.tlsCert != "")
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("admin server: %w", err)
		}
	}()
	return func() { _ = srv.Close() }, nil
}

// adminGuard admits an admin request only when it is addressed to loopback (loopbackOnly: a page that rebinds
// its own host name to 127.0.0.1 reaches the port but not with a loopback Host) and, with names, when its
// verified client certificate carries one of them.
func adminGuard(h http.Handler, loopbackOnly bool, names []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if loopbackOnly && !loopbackHost(r.Host) {
			http.Error(w, "the admin endpoint answers only requests addressed to loopback", http.StatusForbidden)
			return
		}
		if len(names) > 0 && !certNamed(r, names) {
			http.Error(w, "the client certificate names no admin client (--admin-client-names)", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// certNamed says whether the request's verified client certificate names one of names (CN, DNS or URI SAN).
func certNamed(r *http.Request, names []string) bool {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return false
	}
	c := r.TLS.PeerCertificates[0]
	have := append([]string{c.Subject.CommonName}, c.DNSNames...)
	for _, u := range c.URIs {
		have = append(have, u.String())
	}
	for _, n := range have {
		if n != "" && slices.Contains(names, n) {
			return true
		}
	}
	return false
}

// http1Config narrows a gRPC listener's TLS configuration (ALPN h2) to HTTP/1.1 for the admin server.
func http1Config(tc *tls.Config) *tls.Config {
	perClient := tc.GetConfigForClient
	tc.NextProtos = []string{"http/1.1"}
	tc.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		c, err := perClient(h)
		if err != nil {
			return nil, err
		}
		c = c.Clone()
		c.NextProtos = []string{"http/1.1"}
		return c, nil
	}
	return tc
}

// waitForStop serves until ctx ends (nil) or a server fails (its error), reloading the policy on SIGHUP.
func waitForStop(ctx context.Context, g *gateway.Gateway, errc <-chan error) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			_ = g.Policies.Reload()
		case err := <-errc:
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// drain tells health checkers the gateway is going away, lets open streams (requests in flight) finish within
// the drain timeout, then stops.
func drain(cfg serveConfig, log *slog.Logger, gs *grpc.Server, hs *health.Server, draining *atomic.Bool, metricsSrv *http.Server) {
	draining.Store(true)
	log.Info("draining", "timeout", cfg.drainTimeout.String())
	for _, name := range extproc.HealthServices {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
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
}

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
