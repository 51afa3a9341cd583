// Package e2e runs the whole request path on loopback: the Envoy-faithful data plane (reading the shipped
// deploy/envoy config), infergate's ext_proc server, and a simulated fleet. The demo and the end-to-end
// tests share this wiring.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/gateway"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
	"github.com/infergate/infergate/test/envoysim"
)

// Stack is a running gateway stack.
type Stack struct {
	// URL is the data plane's base URL (http://127.0.0.1:port).
	URL string
	// Fleet is the simulated fleet; Settled receives every settlement the processor makes.
	Fleet    *fleetsim.Fleet
	Settled  chan director.Settlement
	Policies *policies.Store
	// ExtProcAddr is where infergate's ext_proc server listens.
	ExtProcAddr string
	// MetricsURL is the in-process gateway's /metrics (empty with Options.ExtprocAddr).
	MetricsURL string
	// Gateway is the in-process gateway (nil with Options.ExtprocAddr); Closed is closed once it has closed
	// after the stack's context ended.
	Gateway *gateway.Gateway
	Closed  chan struct{}

	// What AddReplica starts another gateway replica from.
	policyPath string
	envoyFile  string
	upstreams  map[string]string
	opts       Options
}

// Options choose the files and addresses of a Stack.
type Options struct {
	Root       string // repository root
	EnvoyFile  string // relative to Root
	PolicyFile string // relative to Root
	FleetFile  string // relative to Root
	// FreePorts rebinds every replica and server on a free port (tests); otherwise the files' ports are used.
	FreePorts  bool
	ListenAddr string // data plane address when not FreePorts
	Logger     *slog.Logger
	// Extproc, when set, is an already running processor to use instead of starting one in-process.
	ExtprocAddr string
	// ScrapeInterval is how often the in-process gateway reads the engines' metrics (default 100 ms, as
	// infergate serve); negative: not at all (stand-in replicas without /metrics).
	ScrapeInterval time.Duration
	// XDSAddr, with ExtprocAddr, is that infergate's control plane, for a bootstrap that takes its clusters
	// and routes over ADS.
	XDSAddr string
	// ManagedCADir, when set, receives each managed API's certificate as <name>-ca.pem, for a policy's caFile.
	ManagedCADir string
	// RedisAddrs enforce quotas in Redis; AuditLog, AuditKeyFile and Tracing are gateway.Config's.
	RedisAddrs   []string
	AuditLog     string
	AuditKeyFile string
	Tracing      *telemetry.Tracing
	// RolloutInterval is gateway.Config's (default 1 s).
	RolloutInterval time.Duration
	// Kubernetes is gateway.Config's: the API pools naming a Service are discovered from (discoverytest's).
	Kubernetes discoveryclient.EndpointSlicesGetter
	// Region is gateway.Config's: the gateway's region of a policy with regions.
	Region string
	// BeforeGateway, when set, runs once the fleet is up and before the gateway starts (to announce the
	// fleet's endpoints through Kubernetes, say).
	BeforeGateway func(*fleetsim.Fleet) error
}

var addrRe = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// Start brings the stack up; everything stops when ctx ends.
func Start(ctx context.Context, o Options) (*Stack, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	fcfg, err := fleetsim.LoadConfig(filepath.Join(o.Root, o.FleetFile))
	if err != nil {
		return nil, err
	}
	configured := map[string]string{}       // replica name -> address in the files
	configuredEngine := map[string]string{} // replica name -> its engine's address past the sidecar, in the files
	for i := range fcfg.Replicas {
		configured[fcfg.Replicas[i].Name] = fcfg.Replicas[i].Addr
		configuredEngine[fcfg.Replicas[i].Name] = fcfg.Replicas[i].EngineAddr
		if o.FreePorts {
			fcfg.Replicas[i].Addr = "127.0.0.1:0"
			if fcfg.Replicas[i].EngineAddr != "" {
				fcfg.Replicas[i].EngineAddr = "127.0.0.1:0"
			}
		}
	}
	for i := range fcfg.Managed {
		configured[fcfg.Managed[i].Name] = fcfg.Managed[i].Addr
		if o.ManagedCADir != "" {
			fcfg.Managed[i].CAFile = filepath.Join(o.ManagedCADir, fcfg.Managed[i].Name+"-ca.pem")
		}
	}
	if o.FreePorts {
		fcfg.AdminAddr = "127.0.0.1:0"
		for i := range fcfg.Managed {
			fcfg.Managed[i].Addr = "127.0.0.1:0"
		}
	}
	fleet, err := fleetsim.Start(ctx, fcfg)
	if err != nil {
		return nil, err
	}
	if o.BeforeGateway != nil {
		if err := o.BeforeGateway(fleet); err != nil {
			return nil, err
		}
	}
	real := map[string]string{} // address in the files -> address bound
	for _, r := range fleet.Replicas {
		real[configured[r.Name()]] = r.Addr()
		if e := configuredEngine[r.Name()]; e != "" {
			real[e] = r.EngineAddr()
		}
	}
	for _, m := range fleet.Managed {
		real[configured[m.Name()]] = m.Addr()
	}

	policyData, err := os.ReadFile(filepath.Join(o.Root, o.PolicyFile))
	if err != nil {
		return nil, err
	}
	policyPath := filepath.Join(o.Root, o.PolicyFile)
	if o.FreePorts {
		rewritten := addrRe.ReplaceAllStringFunc(string(policyData), func(a string) string {
			if r, ok := real[a]; ok {
				return r
			}
			return a
		})
		dir, err := os.MkdirTemp("", "infergate-e2e")
		if err != nil {
			return nil, err
		}
		go func() { <-ctx.Done(); _ = os.RemoveAll(dir) }()
		policyPath = filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(policyPath, []byte(rewritten), 0o644); err != nil {
			return nil, err
		}
	}
	st := &Stack{Fleet: fleet, Settled: make(chan director.Settlement, 4096), policyPath: policyPath,
		envoyFile: filepath.Join(o.Root, o.EnvoyFile), upstreams: real, opts: o}

	ecfg, err := envoysim.LoadFile(filepath.Join(o.Root, o.EnvoyFile))
	if err != nil {
		return nil, err
	}
	listen := o.ListenAddr
	if o.FreePorts || listen == "" {
		listen = "127.0.0.1:0"
	}
	if o.ExtprocAddr == "" {
		// The production graph, as infergate serve builds it.
		cfg := st.replicaConfig(ecfg)
		cfg.AuditLog, cfg.AuditKeyFile, cfg.Tracing = o.AuditLog, o.AuditKeyFile, o.Tracing
		cfg.OnSettle = func(s director.Settlement) {
			select {
			case st.Settled <- s:
			default:
			}
		}
		rep, err := StartReplica(ctx, ecfg, cfg, real, listen)
		if err != nil {
			return nil, err
		}
		st.URL, st.ExtProcAddr, st.MetricsURL, st.Policies, st.Gateway = rep.URL, rep.ExtProcAddr, rep.MetricsURL, rep.Gateway.Policies, rep.Gateway
		st.Closed = rep.Closed
		return st, nil
	}
	st.ExtProcAddr = o.ExtprocAddr
	if ecfg.RDSName != "" {
		if o.XDSAddr == "" {
			return nil, fmt.Errorf("%s needs infergate's control plane: the stack's own, or Options.XDSAddr", o.EnvoyFile)
		}
		// Envoy keeps its ADS stream and sees endpoints turn healthy; the test data plane fetches once. An
		// external control plane started before the fleet reports its endpoints unhealthy until it has
		// scraped them: fetch until it reports them healthy, as Envoy would see them a moment later.
		if ecfg, err = fetchHealthy(ctx, filepath.Join(o.Root, o.EnvoyFile), o.XDSAddr); err != nil {
			return nil, err
		}
	}
	if st.URL, err = serveDataPlane(ctx, ecfg, o.ExtprocAddr, real, listen, o.Logger); err != nil {
		return nil, err
	}
	return st, nil
}

// replicaConfig is the gateway configuration of the stack's replicas.
func (st *Stack) replicaConfig(ecfg *envoysim.Config) gateway.Config {
	o := st.opts
	scrape := o.ScrapeInterval
	switch {
	case scrape == 0:
		scrape = 100 * time.Millisecond
	case scrape < 0:
		scrape = 0
	}
	return gateway.Config{PolicyPath: st.policyPath, ScrapeInterval: scrape, Logger: o.Logger, RedisAddrs: o.RedisAddrs,
		RolloutInterval: o.RolloutInterval, Kubernetes: o.Kubernetes, Region: o.Region, SharePlacements: true, RelayScrapes: true, // serve's defaults
		SecretNodes: []string{ecfg.Bootstrap.GetNode().GetId()}, // as serve's default --xds-secret-nodes does for the quickstart
	}
}

// AddReplica starts another gateway replica in front of the same fleet, with the same policy and Redis, and
// its own data plane on a free port; it stops when ctx ends.
func (st *Stack) AddReplica(ctx context.Context) (*Replica, error) {
	ecfg, err := envoysim.LoadFile(st.envoyFile)
	if err != nil {
		return nil, err
	}
	return StartReplica(ctx, ecfg, st.replicaConfig(ecfg), st.upstreams, "127.0.0.1:0")
}

// Replica is one gateway replica: infergate in process, as infergate serve builds it, and the data plane in
// front of it.
type Replica struct {
	URL, ExtProcAddr, MetricsURL string
	Gateway                      *gateway.Gateway
	// Closed is closed once the gateway has closed after ctx ended (its audit log flushed).
	Closed chan struct{}
}

// StartReplica builds a gateway from cfg with its ext_proc server, control plane and /metrics on free
// loopback ports, and serves the data plane ecfg describes on listen in front of it (a bootstrap that takes
// its clusters and routes over ADS fetches them from this gateway). upstreams maps addresses in the policy to
// those bound (nil: as written). Everything stops when ctx ends.
func StartReplica(ctx context.Context, ecfg *envoysim.Config, cfg gateway.Config, upstreams map[string]string, listen string) (*Replica, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := gateway.Build(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep := &Replica{Gateway: g, Closed: make(chan struct{})}
	go func() { <-ctx.Done(); g.Close(); close(rep.Closed) }()
	gs := grpc.NewServer(extproc.ServerOptions()...)
	g.ExtProc.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = gs.Serve(lis) }()
	go func() { <-ctx.Done(); gs.Stop() }()
	rep.ExtProcAddr = lis.Addr().String()
	if rep.MetricsURL, err = serveMetrics(ctx, g); err != nil {
		return nil, err
	}
	if ecfg.RDSName != "" {
		// The bootstrap takes clusters and routes over ADS: serve this gateway's control plane on a free port
		// and let the data plane fetch them, as Envoy does at startup.
		xgs := grpc.NewServer()
		g.XDS.Register(ctx, xgs)
		xlis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		go func() { _ = xgs.Serve(xlis) }()
		go func() { <-ctx.Done(); xgs.Stop() }()
		if err := fetchADS(ctx, ecfg, xlis.Addr().String()); err != nil {
			return nil, err
		}
	}
	if rep.URL, err = serveDataPlane(ctx, ecfg, rep.ExtProcAddr, upstreams, listen, cfg.Logger); err != nil {
		return nil, err
	}
	return rep, nil
}

// StartDataPlane serves the data plane ecfg describes on a free loopback port in front of a gateway that runs
// elsewhere (another process) with its ext_proc server on extprocAddr; a bootstrap that takes its clusters and
// routes over ADS fetches them from xdsAddr. It returns the data plane's base URL and stops when ctx ends.
func StartDataPlane(ctx context.Context, ecfg *envoysim.Config, extprocAddr, xdsAddr string, log *slog.Logger) (string, error) {
	if ecfg.RDSName != "" {
		if err := fetchADS(ctx, ecfg, xdsAddr); err != nil {
			return "", err
		}
	}
	return serveDataPlane(ctx, ecfg, extprocAddr, nil, "127.0.0.1:0", log)
}

// serveDataPlane serves the Envoy-faithful data plane on listen until ctx ends, and returns its base URL.
func serveDataPlane(ctx context.Context, ecfg *envoysim.Config, procAddr string, upstreams map[string]string, listen string, log *slog.Logger) (string, error) {
	dp, err := envoysim.New(ecfg, envoysim.Options{ExtProcAddr: procAddr, Upstreams: upstreams, Logger: log})
	if err != nil {
		return "", err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		dp.Close()
		return "", fmt.Errorf("data plane: %w", err)
	}
	go func() { _ = dp.Serve(ctx, lis); dp.Close() }()
	return "http://" + lis.Addr().String(), nil
}

// fetchADS takes the bootstrap's clusters and routes from addr, as Envoy does at startup.
func fetchADS(ctx context.Context, cfg *envoysim.Config, addr string) error {
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cfg.FetchADS(fctx, addr)
}

// fetchHealthy fetches the bootstrap's clusters and routes from addr until no endpoint is reported unhealthy,
// for at most 15 s (then the last answer stands).
func fetchHealthy(ctx context.Context, bootstrap, addr string) (*envoysim.Config, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		cfg, err := envoysim.LoadFile(bootstrap)
		if err != nil {
			return nil, err
		}
		if err := fetchADS(ctx, cfg, addr); err != nil {
			return nil, err
		}
		healthy := true
		for _, c := range cfg.Clusters {
			healthy = healthy && len(c.Unhealthy) == 0
		}
		if healthy || time.Now().After(deadline) {
			return cfg, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// serveMetrics serves the gateway's registry on a free loopback port, as infergate serve's --metrics-addr does.
func serveMetrics(ctx context.Context, g *gateway.Gateway) (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return "http://" + lis.Addr().String() + "/metrics", nil
}

// FindRoot walks up from the working directory to the directory holding go.mod.
func FindRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above %s", strings.TrimSpace(dir))
		}
		dir = parent
	}
}
