package main

import (
	"context"
	"log"
	"os"
	"path/filepath"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/gateway"
	"github.com/infergate/infergate/telemetry"
)

// benchRollout is a rollout of the quickstart's qwen model onto a second pool, added to the policy the main
// table measures so that every decision for that model splits conversation groups between two arms. It has no
// compatibility gate: with no engines scraped, the candidate takes its first step at once.
const benchRollout = `
    - name: qwen7b-l40s-v2
      hardwareClass: l40s
      engine: vllm
      servedModel: Qwen/Qwen2.5-7B-Instruct
      endpoints: ["127.0.0.1:18123", "127.0.0.1:18124"]
    rollout:
      candidate: {pool: qwen7b-l40s-v2}
      baseline: {pools: [qwen7b-l40s]}
      steps:
      - {percent: 50, minDuration: 1h, minRequests: 1000000}
      - {percent: 100, minDuration: 1h, minRequests: 1000000}
      gates: {window: 20s, minRequests: 50, maxTTFTP95Ratio: 1.5}
`

// startGateway builds infergate as `infergate serve` does (gateway.Build) over the policy at path with a
// rollout added, every span sampled to a no-op exporter through the SDK's batcher, the audit log written to a
// folder with digests, the goodput series, autoscaler and rollout gates observing every settlement: the
// configuration issue #40's targets are set in. No Redis (the quota rows measure that) and no scraping.
func startGateway(path string) (client extprocv3.ExternalProcessorClient, stop func()) {
	data, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	withRollout, ok := addRollout(string(data))
	if !ok {
		log.Fatalf("%s has no qwen7b-l40s pool to roll out beside; the main table needs the quickstart policy", path)
	}
	dir, err := os.MkdirTemp("", "infergate-extprocbench")
	if err != nil {
		log.Fatal(err)
	}
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(withRollout), 0o600); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tracing := telemetry.NewTracing(telemetry.ExportCopies(tracetest.NewNoopExporter()), sdktrace.AlwaysSample(), nil)
	g, err := gateway.Build(ctx, gateway.Config{PolicyPath: policyPath, Tracing: tracing, AuditLog: filepath.Join(dir, "audit")})
	if err != nil {
		log.Fatal(err)
	}
	c, stopServer := startProcessor(g.ExtProc)
	return c, func() {
		stopServer()
		cancel()
		g.Close()
		_ = os.RemoveAll(dir)
	}
}

// addRollout inserts benchRollout after the quickstart's qwen pool.
func addRollout(policy string) (string, bool) {
	const anchor = `endpoints: ["127.0.0.1:18121", "127.0.0.1:18122"]`
	i := strings.Index(policy, anchor)
	if i < 0 {
		return "", false
	}
	end := i + len(anchor)
	return policy[:end] + strings.TrimRight(benchRollout, "\n") + policy[end:], true
}
