// Command infergate is the LLM routing gateway for Envoy: `serve` runs the ext_proc, xDS and metrics servers;
// `validate`, `schema` and `hash-key` help write policies.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
