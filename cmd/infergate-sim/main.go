// Command infergate-sim serves a simulated fleet — vLLM/SGLang-compatible replicas on simulated GPUs and fake
// managed APIs — so infergate can be tried without GPUs. It is its own binary, apart from the production
// infergate, because its fault-injection admin API must never ship in a gateway.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/infergate/infergate/fleetsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run serves the fleet until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("infergate-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fleetFile := fs.String("fleet", "examples/quickstart/fleet.yaml", "fleet description (YAML)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := fleetsim.LoadConfig(*fleetFile)
	if err != nil {
		fmt.Fprintln(stderr, "infergate-sim:", err)
		return 1
	}
	fleet, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "infergate-sim:", err)
		return 1
	}
	for _, r := range fleet.Replicas {
		fmt.Fprintf(stdout, "replica %-20s http://%s\n", r.Name(), r.Addr())
	}
	for _, m := range fleet.Managed {
		fmt.Fprintf(stdout, "managed %-20s https://%s\n", m.Name(), m.Addr())
	}
	if a := fleet.AdminAddr(); a != "" {
		fmt.Fprintf(stdout, "faults: PUT http://%s/faults/<replica>\n", a)
	}
	<-ctx.Done()
	return 0
}
