package telemetry

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
)

func TestSamplerFromEnv(t *testing.T) {
	cases := []struct {
		sampler, arg, want string
		err                bool
	}{
		{"", "", "ParentBased{root:AlwaysOnSampler", false},
		{"always_off", "", "AlwaysOffSampler", false},
		{"traceidratio", "0.25", "TraceIDRatioBased{0.25}", false},
		{"parentbased_traceidratio", "0.1", "ParentBased{root:TraceIDRatioBased{0.1}", false},
		{"parentbased_traceidratio", "", "ParentBased{root:TraceIDRatioBased{1}", false},
		{"traceidratio", "2", "", true},
		{"jaeger_remote", "", "", true},
	}
	for _, c := range cases {
		env := map[string]string{"OTEL_TRACES_SAMPLER": c.sampler, "OTEL_TRACES_SAMPLER_ARG": c.arg}
		s, err := samplerFromEnv(func(k string) string { return env[k] })
		if (err != nil) != c.err || (err == nil && !strings.HasPrefix(s.Description(), c.want)) {
			t.Errorf("%s %s: %v, %v; want %s (error %v)", c.sampler, c.arg, s, err, c.want, c.err)
		}
	}
}

// The span recorded at the end has the ids sent upstream at routing, and a request the sampler drops sends
// nothing upstream and records nothing.
func TestRequestSpanKeepsTheIDsSentUpstream(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tr := NewTracing(keep{mem}, nil, nil) // parentbased_always_on
	started := time.Unix(5000, 0)
	end := func(r *Request) {
		r.End(director.Settlement{Routed: true, Model: "m", Operation: openai.EndpointChat, Outcome: director.OutcomeOK},
			Marks{Ended: started.Add(time.Second)})
	}
	root := tr.Begin("", "", "", openai.EndpointChat, started)
	tp, _ := root.Upstream()
	end(root)
	child := tr.Begin("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v", "", openai.EndpointChat, started)
	ctp, cts := child.Upstream()
	end(child)
	dropped := tr.Begin("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "", "", openai.EndpointChat, started)
	if dtp, _ := dropped.Upstream(); dtp != "" || dropped.TraceID() != "" {
		t.Errorf("an unsampled parent's request sent %q upstream", dtp)
	}
	end(dropped)
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := mem.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (the dropped request records none)", len(spans))
	}
	for i, want := range []string{tp, ctp} {
		sc := spans[i].SpanContext
		if got := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; got != want {
			t.Errorf("span %d is %s, upstream was told %s", i, got, want)
		}
		if !spans[i].StartTime.Equal(started) || spans[i].Name != "chat m" {
			t.Errorf("span %d %q starts %v", i, spans[i].Name, spans[i].StartTime)
		}
	}
	if spans[1].Parent.SpanID().String() != "00f067aa0ba902b7" || cts != "k=v" || root.TraceID() == "" {
		t.Errorf("child's parent %s, tracestate %q", spans[1].Parent.SpanID(), cts)
	}
}

// keep is an in-memory exporter whose spans survive Shutdown, which flushes them.
type keep struct{ *tracetest.InMemoryExporter }

func (keep) Shutdown(context.Context) error { return nil }

// Whose trace context counts is the operator's choice: honoured, a client's sampled flag decides its requests'
// sampling; ignored, the sampler alone decides and the client's context is only linked; trusted, it counts
// from the trusted addresses only.
func TestClientTraceContextPolicy(t *testing.T) {
	const sampledParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	trusted, err := ParseClientContext(ClientContextTrusted, "10.0.0.0/8, 192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	ignore, _ := ParseClientContext(ClientContextIgnore, "")
	honour, _ := ParseClientContext("", "")
	tests := []struct {
		name        string
		policy      ClientContext
		source      string
		wantSampled bool
	}{
		{"honoured: the client's flag samples", honour, "203.0.113.9", true},
		{"ignored: the sampler alone decides", ignore, "203.0.113.9", false},
		{"trusted source", trusted, "10.1.2.3", true},
		{"trusted single address", trusted, "192.0.2.7", true},
		{"untrusted source", trusted, "203.0.113.9", false},
		{"unknown source", trusted, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := tracetest.NewInMemoryExporter()
			// parentbased over a sampler that samples no root: only a honoured, sampled parent is traced.
			tr := NewTracing(keep{mem}, sdktrace.ParentBased(sdktrace.NeverSample()), nil).WithClientContext(tc.policy)
			r := tr.Begin(sampledParent, "", tc.source, openai.EndpointChat, time.Unix(5000, 0))
			tp, _ := r.Upstream()
			if sampled := tp != ""; sampled != tc.wantSampled {
				t.Errorf("sampled %v, want %v", sampled, tc.wantSampled)
			}
		})
	}
	// Ignored but sampled by the sampler: a trace of its own, linked to the client's.
	mem := tracetest.NewInMemoryExporter()
	tr := NewTracing(keep{mem}, sdktrace.AlwaysSample(), nil).WithClientContext(ignore)
	r := tr.Begin(sampledParent, "", "203.0.113.9", openai.EndpointChat, time.Unix(5000, 0))
	r.End(director.Settlement{Routed: true, Model: "m", Operation: openai.EndpointChat, Outcome: director.OutcomeOK},
		Marks{Ended: time.Unix(5001, 0)})
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := mem.GetSpans()
	if len(spans) != 1 || spans[0].Parent.IsValid() || spans[0].SpanContext.TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" ||
		len(spans[0].Links) != 1 || spans[0].Links[0].SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("ignored context: spans %+v, want a root span linked to the client's", spans)
	}
	for _, bad := range [][2]string{{"sometimes", ""}, {ClientContextTrusted, ""}, {ClientContextTrusted, "not-an-address"}} {
		if _, err := ParseClientContext(bad[0], bad[1]); err == nil {
			t.Errorf("ParseClientContext(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// A split request's span names its prefill endpoint beside its decode endpoint (server.address).
func TestSplitRequestSpanNamesItsPrefiller(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tr := NewTracing(keep{mem}, nil, nil)
	r := tr.Begin("", "", "", openai.EndpointChat, time.Unix(5000, 0))
	r.Upstream()
	r.End(director.Settlement{Routed: true, Model: "m", Operation: openai.EndpointChat, Outcome: director.OutcomeOK,
		Endpoint: "10.0.1.21:8000", Prefill: "10.0.0.11:8000"}, Marks{Ended: time.Unix(5001, 0)})
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := mem.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	got := map[string]string{}
	for _, kv := range spans[0].Attributes {
		got[string(kv.Key)] = kv.Value.String()
	}
	if got["infergate.prefill_endpoint"] != "10.0.0.11:8000" || got["server.address"] != "10.0.1.21" {
		t.Errorf("attributes %v", got)
	}
}
