// Command regionchaos runs infergate's regions over a real network: each region a network namespace with its
// gateway, engines and data plane, Toxiproxy between them (test/regionnet), and the scenarios of
// RELIABILITY.md's regions table. Root only (network namespaces). make chaos-regions.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/infergate/infergate/test/regionnet"
)

func main() {
	only := flag.String("only", "", "run only the scenario of this name")
	keep := flag.Bool("keep", false, "keep the scratch folder (logs)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, *only, *keep))
}

// home is the region whose engines the scenarios take down (the cluster's first).
const home = "us-east"

// dump, with -keep, saves what the home region's gateway exports at the end of each outage.
var dump func(c *regionnet.Cluster, scenario string)

func run(ctx context.Context, only string, keep bool) int {
	if err := regionnet.Supported(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "regionchaos: network namespaces are not available here (root and ip(8) needed):", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "regionchaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if !keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Println("logs in", dir)
		dump = func(c *regionnet.Cluster, scenario string) { // what home's gateway exports at the end of each outage
			resp, err := http.Get(c.MetricsURL(home))
			if err != nil {
				return
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			_ = os.WriteFile(filepath.Join(dir, "metrics-"+scenario+".txt"), data, 0o644)
		}
	}
	root, _ := os.Getwd()
	bins, err := build(ctx, root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "regionchaos:", err)
		return 1
	}
	opts := regionnet.Options{Infergate: bins[0], Sim: bins[1], Edge: bins[2], Root: root, Dir: dir,
		Regions: []string{"us-east", "us-west", "eu-west"},
		RTT:     map[string]time.Duration{"us-east/us-west": 40 * time.Millisecond, "us-east/eu-west": 60 * time.Millisecond, "us-west/eu-west": 80 * time.Millisecond},
		Inside:  "eu-west", Failback: 3 * time.Second, MeteredRPS: 20}
	c, err := regionnet.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "regionchaos: start:", err)
		return 1
	}
	defer c.Close()
	var all []regionnet.Figures
	failed := false
	for _, sc := range regionnet.Scenarios() {
		if only != "" && sc.Name != only {
			continue
		}
		fmt.Printf("scenario %s: %s\n", sc.Name, sc.What)
		var atEnd func()
		if dump != nil {
			atEnd = func() { dump(c, sc.Name) }
		}
		f, err := c.Run(ctx, sc, regionnet.DefaultPhases, atEnd)
		if err != nil {
			fmt.Fprintln(os.Stderr, "regionchaos:", err)
			return 1
		}
		all = append(all, f)
		failed = f.Report(os.Stdout) || failed
	}
	fmt.Println()
	regionnet.Table(os.Stdout, all)
	if failed {
		return 1
	}
	return 0
}

// build compiles infergate, infergate-sim and the edge into dir.
func build(ctx context.Context, root, dir string) ([3]string, error) {
	var out [3]string
	for i, pkg := range []string{"./cmd/infergate", "./cmd/infergate-sim", "./test/regionnet/edge"} {
		out[i] = filepath.Join(dir, filepath.Base(pkg))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out[i], pkg)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return out, fmt.Errorf("build %s: %w", pkg, err)
		}
	}
	return out, nil
}
