// Command edge is one region's edge in the region tests (test/regionnet): the test data plane (envoysim, in
// front of the region's infergate: ext_proc, and its clusters and routes over ADS) and a Toxiproxy server
// whose proxies, made by the test through its API, carry this region's traffic to the other regions. It runs in
// the region's network namespace and ends when its standard input closes (its parent is gone) or on SIGTERM.
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
	"strings"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/test/envoysim"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "", "data plane listen address")
	bootstrap := flag.String("bootstrap", "deploy/envoy/envoy-xds.yaml", "Envoy bootstrap that takes its clusters and routes over ADS")
	extproc := flag.String("extproc", "127.0.0.1:9002", "the region's infergate ext_proc address")
	failover := flag.String("extproc-failover", "", "the other regions' infergate ext_proc addresses, in the region's failover order: the bootstrap's ext_proc cluster then has the region's own at priority 0 and these at 1, 2, … (deploy/envoy/envoy-regions.yaml)")
	region := flag.String("region", "", "the region this data plane serves, named on every ext_proc stream (x-infergate-edge-region)")
	xds := flag.String("xds", "127.0.0.1:18000", "the region's infergate xDS address")
	proxies := flag.String("toxiproxy", "", "Toxiproxy API listen address (host:port)")
	wait := flag.Duration("wait", time.Minute, "how long to wait for the region's infergate to read every engine")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }() // the parent is gone
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	host, port, err := net.SplitHostPort(*proxies)
	if err != nil {
		return fmt.Errorf("-toxiproxy: %w", err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	go srv.Listen(host, port)

	cfg, err := fetch(ctx, *bootstrap, *xds, *wait)
	if err != nil {
		return err
	}
	opts := envoysim.Options{ExtProcAddr: *extproc, Logger: log}
	if *failover != "" {
		if err := failOver(cfg, *extproc, strings.Split(*failover, ","), *region); err != nil {
			return err
		}
		opts.ExtProcAddr = "" // the cluster's hosts, by priority
	}
	dp, err := envoysim.New(cfg, opts)
	if err != nil {
		return err
	}
	defer dp.Close()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Println("ready") // the harness waits for this line
	if err := dp.Serve(ctx, lis); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
		return err
	}
	return nil
}

// failOver gives the bootstrap's ext_proc cluster the region's own gateway at priority 0 and the others in
// order after it, and names the region on the ext_proc streams.
func failOver(cfg *envoysim.Config, own string, others []string, region string) error {
	name := cfg.ExtProc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c, ok := cfg.Clusters[name]
	if !ok || c.HealthCheck == nil {
		return fmt.Errorf("the bootstrap's ext_proc cluster %q is missing or not health-checked", name)
	}
	c.Endpoints, c.Priorities = []string{own}, []int{0}
	for i, o := range others {
		c.Endpoints, c.Priorities = append(c.Endpoints, o), append(c.Priorities, i+1)
	}
	found := false
	for _, hv := range cfg.ExtProc.GetGrpcService().GetInitialMetadata() {
		if hv.GetKey() == contract.EdgeRegionMetadata {
			hv.Value, found = region, true
		}
	}
	if !found {
		return fmt.Errorf("the bootstrap's ext_proc filter does not name its region (%s)", contract.EdgeRegionMetadata)
	}
	return nil
}

// healthy says whether no endpoint of the snapshot is reported unhealthy.
func healthy(cfg *envoysim.Config) bool {
	for _, c := range cfg.Clusters {
		if len(c.Unhealthy) > 0 {
			return false
		}
	}
	return true
}

// fetch takes the bootstrap's clusters and routes from the region's infergate, retrying until it answers.
func fetch(ctx context.Context, bootstrap, xds string, wait time.Duration) (*envoysim.Config, error) {
	deadline := time.Now().Add(wait)
	for {
		cfg, err := envoysim.LoadFile(bootstrap)
		if err != nil {
			return nil, err
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = cfg.FetchADS(fctx, xds)
		cancel()
		// The data plane keeps this one snapshot (envoysim does not follow updates): take one in which the
		// gateway has read every engine, the other regions' too, or the last one by the deadline.
		if err == nil && (healthy(cfg) || time.Now().After(deadline)) {
			return cfg, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("xDS from %s: %w", xds, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}
