package main

import (
	"context"
	"fmt"
	"io"

	"github.com/infergate/infergate/test/fleetsim"
)

// cmdSim serves a simulated fleet (vLLM/SGLang-compatible replicas and fake managed APIs) until ctx ends.
func cmdSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sim", stderr)
	fleetFile := fs.String("fleet", "examples/quickstart/fleet.yaml", "fleet description (YAML)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := fleetsim.LoadConfig(*fleetFile)
	if err != nil {
		fmt.Fprintln(stderr, "infergate sim:", err)
		return 1
	}
	fleet, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "infergate sim:", err)
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
