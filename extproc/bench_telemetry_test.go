package extproc

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// BenchmarkDecisionTelemetry is the processor's work per request with telemetry off and fully on: every span
// sampled and batched to a no-op exporter, digests and the audit log to a file, the goodput series.
//
//	go test ./extproc -run '^$' -bench DecisionTelemetry -benchmem -count 6
func BenchmarkDecisionTelemetry(b *testing.B) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	tracing := telemetry.NewTracing(telemetry.ExportCopies(tracetest.NewNoopExporter()), sdktrace.AlwaysSample(), nil)
	b.Cleanup(func() { _ = tracing.Shutdown(context.Background()) })
	alog, err := audit.New(audit.Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = alog.Close() })
	servers := map[string]*Server{
		"off": New(Options{Policies: policies.NewStaticStore(snap)}),
		"on": newServer(policies.NewStaticStore(snap), config{Options: Options{Tracing: tracing, DigestKey: testDigestKey},
			Director: director.Options{Observers: []director.SettleObserver{telemetry.NewMetrics(nil), alog}}}),
	}
	for _, size := range []int{2 << 10, 32 << 10} {
		body, hdrs := benchRequest(size)
		done := respHeaders("200", true)
		for _, name := range []string{"off", "on"} {
			srv := servers[name]
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					rs := &requestState{srv: srv, ctx: context.Background(), seenFirst: true, reqMode: modeBuffered, respMode: modeNone, deferSettle: true}
					rs.handle(hdrs)
					rs.handle(reqBody(body, true))
					rs.sent()
					rs.handle(done)
					rs.sent()
					rs.close()
				}
			})
		}
	}
}
