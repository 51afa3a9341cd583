package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// telemetryTarget is how much slower a decision may be with telemetry on.
const telemetryTarget = 1.05

// benchTelemetry compares decisions with telemetry off and fully on — every span sampled and exported through
// the SDK's batcher to a no-op exporter, the audit log written to a file with digests, the goodput series
// recorded — interleaved on the same machine.
func benchTelemetry(snap *policies.Snapshot, runs int, scale float64, chunk int, only string) {
	off, stopOff := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(snap)}))
	defer stopOff()
	tracing := telemetry.NewTracing(telemetry.ExportCopies(tracetest.NewNoopExporter()), sdktrace.AlwaysSample(), nil)
	defer func() { _ = tracing.Shutdown(context.Background()) }()
	dir, err := os.MkdirTemp("", "infergate-bench-audit")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	reg := prometheus.NewRegistry()
	alog, err := audit.New(audit.Options{Dir: dir, Registerer: reg})
	if err != nil {
		log.Fatal(err)
	}
	defer alog.Close()
	on, stopOn := startProcessor(withObservers(snap, extproc.Options{Tracing: tracing, DigestKey: audit.EphemeralDigestKey()},
		telemetry.NewMetrics(reg), alog))
	defer stopOn()
	// The same without the audit log, whose prompt digest (SHA-256 over the whole prompt) is most of the cost.
	noAudit, stopNoAudit := startProcessor(withObservers(snap, extproc.Options{Tracing: tracing},
		telemetry.NewMetrics(prometheus.NewRegistry())))
	defer stopNoAudit()

	fmt.Printf("\nTelemetry on (spans sampled at 100%% to a no-op exporter, audit to a file, goodput series) against off, "+
		"%d interleaved runs per row; latencies are each side's requests pooled, ratios the median of the ratios of "+
		"the runs' three thirds, each pooled; last but two, the ratio of all runs pooled and its 90%% bootstrap "+
		"interval; target (concurrency 1): on within +%.0f%% of off at p50 and p99\n\n", runs, (telemetryTarget-1)*100)
	fmt.Println("| prompt | body mode | concurrency | off p50 | on p50 | on/off p50 | off p99 | on p99 | on/off p99 | all runs: p99 ratio (90% interval) | target | without audit: p50, p99 / off |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
	for _, size := range []int{2 << 10, 32 << 10} {
		n := map[int]int{2 << 10: 4000, 32 << 10: 2000}[size]
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED} {
			for _, conc := range []int{1, 32} {
				if !strings.Contains(rowDesc(size, mode, conc), only) {
					continue
				}
				cfg := config{promptBytes: size, mode: mode, concurrency: conc, requests: max(64, int(float64(n)*scale))}
				body := chatBody(size)
				var offs, ons, noAudits []result
				for range runs {
					for _, m := range []struct {
						client extprocv3.ExternalProcessorClient
						into   *[]result
					}{{off, &offs}, {on, &ons}, {noAudit, &noAudits}} {
						r, err := measure(m.client, cfg, body, chunk)
						if err != nil {
							log.Fatal(err)
						}
						*m.into = append(*m.into, r)
					}
				}
				a, b := pooledResult(offs), pooledResult(ons)
				p50, p99 := medianOfThirds(offs, ons, 0.50), medianOfThirds(offs, ons, 0.99)
				c50, c99 := medianOfThirds(offs, noAudits, 0.50), medianOfThirds(offs, noAudits, 0.99)
				all99 := float64(b.p99) / float64(a.p99)
				lo, hi := ratioInterval(offs, ons, 0.99)
				// As for the decision-latency table, the target is the latency of one request at a time; at
				// concurrency 32 both processes saturate the two cores and the row shows what telemetry's CPU
				// costs in queueing.
				verdict := "(saturated: no target)"
				if conc == 1 {
					verdict = "met"
					if p50 > telemetryTarget || p99 > telemetryTarget {
						verdict = "not met"
					}
				}
				fmt.Printf("| %d KiB | %s | %d | %s | %s | %.2f | %s | %s | %.2f | %.2f (%.2f-%.2f) | %s | %.2f, %.2f |\n", size>>10, modeName(mode), conc,
					fmtDur(a.p50), fmtDur(b.p50), p50, fmtDur(a.p99), fmtDur(b.p99), p99, all99, lo, hi, verdict, c50, c99)
			}
		}
	}
}

// pooledResult is the p50 and p99 over every request of runs (see pooled.go).
func pooledResult(runs []result) result {
	return result{p50: pooled(runs, 0.50), p99: pooled(runs, 0.99)}
}

// withObservers is a processor over snap whose director tells obs of every settlement.
func withObservers(snap *policies.Snapshot, o extproc.Options, obs ...director.SettleObserver) *extproc.Server {
	o.Policies = policies.NewStaticStore(snap)
	o.Director = director.New(director.Options{Policies: o.Policies, Observers: obs})
	return extproc.New(o)
}
