// Package telemetry measures goodput where only the gateway can: it turns each settled request into the
// OpenTelemetry GenAI metrics and span, joined to the client's trace and handed on to the engine, so one trace
// shows the gateway's decision beside the engine's prefill and decode.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
)

// Tracing starts one span per request under the client's W3C trace context and ends it with what the request
// did. A nil *Tracing traces nothing.
type Tracing struct {
	tracer   trace.Tracer
	prop     propagation.TraceContext
	shutdown func(context.Context) error
}

// NewTracing exports spans to exp through the SDK's batch span processor (fed in bursts, see coalescer), with
// the other provider options given (sampler, resource). Tests and benchmarks pass an in-process exporter.
func NewTracing(exp sdktrace.SpanExporter, opts ...sdktrace.TracerProviderOption) *Tracing {
	proc := newCoalescer(sdktrace.NewBatchSpanProcessor(exp), coalesceEvery)
	tp := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(proc)}, opts...)...)
	return &Tracing{tracer: tp.Tracer("github.com/infergate/infergate", trace.WithSchemaURL(semconv.SchemaURL)),
		shutdown: tp.Shutdown}
}

// TracingFromEnv builds what the standard OTEL_* variables ask for, or returns nil (off, the default) when
// they name no OTLP endpoint: OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (gRPC),
// unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The exporter reads the other OTEL_EXPORTER_OTLP_*
// settings (headers, TLS, timeout), the SDK OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (for example
// parentbased_traceidratio with 0.1) and OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
func TracingFromEnv(ctx context.Context, version string) (*Tracing, error) {
	if !tracingWanted(os.Getenv) {
		return nil, nil
	}
	if p := cmpEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "grpc" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: infergate exports traces over OTLP/gRPC only; set grpc", p)
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceVersion(version)))
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		res, _ = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName("infergate")))
	}
	return NewTracing(exp, sdktrace.WithResource(res)), nil
}

func tracingWanted(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func cmpEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// Shutdown flushes the spans still queued.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// carrier is the two W3C headers a request may bring.
type carrier struct{ traceparent, tracestate string }

func (c *carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (c *carrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.traceparent = value
	case "tracestate":
		c.tracestate = value
	}
}

func (c *carrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// Start opens the span of a request that arrived at started, as a child of the client's trace when its
// traceparent is valid.
func (t *Tracing) Start(ctx context.Context, traceparent, tracestate string, ep openai.Endpoint, started time.Time) trace.Span {
	if t == nil {
		return nil
	}
	ctx = t.prop.Extract(ctx, &carrier{traceparent, tracestate})
	_, span := t.tracer.Start(ctx, operation(ep), trace.WithTimestamp(started), trace.WithSpanKind(trace.SpanKindClient))
	return span
}

// Upstream is the traceparent and tracestate to send to the engine, so its spans join the request's trace;
// empty when the span is not sampled.
func Upstream(span trace.Span) (traceparent, tracestate string) {
	if span == nil || !span.SpanContext().IsSampled() {
		return "", ""
	}
	var c carrier
	propagation.TraceContext{}.Inject(trace.ContextWithSpan(context.Background(), span), &c)
	return c.traceparent, c.tracestate
}

// TraceID is the span's trace id in hex, "" without a sampled span (an id no trace store holds would only
// mislead whoever looks it up).
func TraceID(span trace.Span) string {
	if span == nil || !span.SpanContext().IsSampled() {
		return ""
	}
	return span.SpanContext().TraceID().String()
}

// Marks are the instants of a request the span shows as events.
type Marks struct {
	Routed, FirstToken, Ended time.Time
}

// End closes a request's span with the GenAI attributes of its settlement and the routed and first-token
// events.
func End(span trace.Span, st director.Settlement, m Marks) {
	if span == nil || !span.IsRecording() {
		if span != nil {
			span.End()
		}
		return
	}
	span.SetName(operation(st.Operation) + " " + st.Model)
	buf := attrPool.Get().(*[]attribute.KeyValue)
	defer func() { *buf = (*buf)[:0]; attrPool.Put(buf) }()
	attrs := append((*buf)[:0],
		operationAttr(st.Operation),
		semconv.GenAIRequestModel(st.Model),
		attribute.String("infergate.request_id", st.RequestID),
		attribute.String("infergate.tenant", st.Tenant),
		attribute.String("infergate.tier", st.Tier),
		attribute.String("infergate.outcome", st.Outcome),
		attribute.Bool("infergate.good", st.Good),
		attribute.Float64("infergate.queue.duration", st.Timing.Queued.Seconds()),
	)
	if st.Routed {
		attrs = append(attrs,
			semconv.GenAIResponseModel(st.ServedModel),
			semconv.GenAIUsageInputTokens(int(st.Usage.PromptTokens)),
			semconv.GenAIUsageOutputTokens(int(st.Usage.CompletionTokens)),
			attribute.String("infergate.pool", st.Pool),
			attribute.String("infergate.hardware_class", st.HardwareClass),
			attribute.Float64("infergate.prefix_match_share", st.PrefixShare),
			attribute.Bool("infergate.usage_reported", st.Reported),
		)
		if st.Usage.CachedReported {
			attrs = append(attrs, semconv.GenAIUsageCacheReadInputTokens(int(st.Usage.CachedTokens)))
		}
		if host, port, err := net.SplitHostPort(st.Endpoint); err == nil {
			p, _ := strconv.Atoi(port)
			attrs = append(attrs, semconv.ServerAddress(host), semconv.ServerPort(p))
		} else if st.Endpoint != "" {
			attrs = append(attrs, semconv.ServerAddress(st.Endpoint))
		}
		if st.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(st.Status))
		}
		if !m.Routed.IsZero() {
			span.AddEvent("routed", trace.WithTimestamp(m.Routed), trace.WithAttributes(
				attribute.String("infergate.pool", st.Pool), attribute.String("infergate.endpoint", st.Endpoint)))
		}
		if !m.FirstToken.IsZero() {
			span.AddEvent("first token", trace.WithTimestamp(m.FirstToken))
		}
	}
	if st.Outcome != director.OutcomeOK {
		attrs = append(attrs, semconv.ErrorTypeKey.String(st.Outcome))
		span.SetStatus(codes.Error, st.Outcome)
	}
	span.SetAttributes(attrs...) // copies them
	*buf = attrs
	span.End(trace.WithTimestamp(m.Ended))
}

// attrPool holds the attribute lists End builds: the span copies them, so one list serves request after request.
var attrPool = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 32); return &s }}

// Reject closes the span of a request the gateway answered itself before routing it (bad body, unknown key).
func Reject(span trace.Span, status int, code string, ended time.Time) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status), semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, code)
	}
	span.End(trace.WithTimestamp(ended))
}

func operation(ep openai.Endpoint) string {
	switch ep {
	case openai.EndpointCompletions:
		return "text_completion"
	case openai.EndpointEmbeddings:
		return "embeddings"
	}
	return "chat"
}

func operationAttr(ep openai.Endpoint) attribute.KeyValue {
	return semconv.GenAIOperationNameKey.String(operation(ep))
}
