package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/infergate/infergate/capacity"
	"github.com/infergate/infergate/policies"
)

const planUsage = `usage: infergate plan --policy FILE --workload FILE [--json]
       infergate plan --live ADDR [--interval 10s] [--json]

With a workload: for every model and each of its pools, the KV cache a replica keeps after the weights, the
sequences it holds, its decode and prefill speed at that batch, the replicas the load needs within the SLO
(with headroom and a warm minimum of 2), their cost per hour and per 1M output tokens, how the replicas change
with the prefix-cache hit rate, and the load above which self-hosting beats the managed fallback's price.

With --live: a running gateway's view of its fleet, read twice --interval apart from its /metrics (ADDR is
serve's --metrics-addr): KV capacity and use per pool, queues, hit rate, TTFT p95, headroom, and the pool that
reaches the KV wall first at the current growth.

Flags:`

func cmdPlan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("plan", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, planUsage); fs.PrintDefaults() }
	policy := fs.String("policy", "", "policy file (pools, hardware classes with gpu, fallbacks with pricing)")
	workload := fs.String("workload", "", "workload file: per model its architecture, precision and load")
	live := fs.String("live", "", "a running gateway's metrics address (host:port or URL) instead of a workload")
	interval := fs.Duration("interval", 10*time.Second, "with --live: time between the two readings that give growth")
	asJSON := fs.Bool("json", false, "print JSON for tools")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *live != "" {
		return planLive(ctx, *live, *interval, *asJSON, stdout, stderr)
	}
	if *policy == "" || *workload == "" {
		fmt.Fprintln(stderr, "infergate plan: --policy and --workload are required (or --live ADDR)")
		return 2
	}
	snap, err := policies.LoadFile(*policy)
	if err != nil {
		printPolicyError(stderr, err)
		return 1
	}
	w, archs, err := capacity.LoadWorkload(*workload)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	plans, err := capacity.Plan(snap, w, archs)
	if err != nil {
		fmt.Fprintln(stderr, "infergate plan:", err)
		return 1
	}
	if *asJSON {
		return writeJSON(stdout, stderr, plans)
	}
	capacity.Render(stdout, plans)
	return 0
}

func planLive(ctx context.Context, addr string, interval time.Duration, asJSON bool, stdout, stderr io.Writer) int {
	if interval <= 0 || interval > 10*time.Minute {
		fmt.Fprintln(stderr, "infergate plan: --interval must be above 0 and at most 10m")
		return 2
	}
	report, err := capacity.ReadLive(ctx, addr, interval)
	if err != nil {
		fmt.Fprintln(stderr, "infergate plan --live:", err)
		return 1
	}
	if asJSON {
		return writeJSON(stdout, stderr, report)
	}
	capacity.RenderLive(stdout, report)
	return 0
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(stderr, "infergate plan:", err)
		return 1
	}
	return 0
}

// printPolicyError prints every problem of an invalid policy, one per line, or the error.
func printPolicyError(stderr io.Writer, err error) {
	var inv *policies.InvalidError
	if errors.As(err, &inv) {
		for _, p := range inv.Problems {
			fmt.Fprintln(stderr, p.String())
		}
		return
	}
	fmt.Fprintln(stderr, err)
}
