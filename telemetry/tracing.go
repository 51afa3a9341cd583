// Package telemetry measures goodput where only the gateway can: it turns each settled request into the
// OpenTelemetry GenAI metrics and span, joined to the client's trace and handed on to the engine, so one trace
// shows the gateway's decision beside the engine's prefill and decode.
package telemetry

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
)

// Tracing gives each request a span under the client's W3C trace context, ending it with what the request did.
// The span is recorded when the request ends, so the decision's path pays only for fixing its ids and sampling
// (see Request). A nil *Tracing traces nothing.
type Tracing struct {
	proc     sdktrace.SpanProcessor
	sampler  sdktrace.Sampler
	resource *resource.Resource
	scope    instrumentation.Scope
	// recycle reuses spans' attribute and event storage after export (see ExportCopies).
	recycle bool
	client  ClientContext
}

// WithClientContext sets whose trace context counts (by default every client's) and returns t.
func (t *Tracing) WithClientContext(c ClientContext) *Tracing {
	if t != nil {
		t.client = c
	}
	return t
}

// exportBatch is how many spans one export carries: small batches keep fewer ended spans alive between exports,
// which every garbage collection would scan (the SDK's default is 512).
const exportBatch = 128

// NewTracing exports spans to exp through the SDK's batch span processor (fed in bursts, see coalescer), sampled
// by sampler (nil: parentbased_always_on), describing this process as res (nil: the SDK's default resource).
// Tests and benchmarks pass an in-process exporter; one wrapped by ExportCopies has its spans' storage reused.
//
// A request's span is known whole only when the request ends, so it is handed to the processor as the finished
// read-only span the SDK's own spans become on End, built in one step: no recording span, attribute
// de-duplication or copy on the way (the attributes are infergate's own, each set once).
func NewTracing(exp sdktrace.SpanExporter, sampler sdktrace.Sampler, res *resource.Resource) *Tracing {
	if sampler == nil {
		sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	if res == nil {
		res = resource.Default()
	}
	_, recycle := exp.(*recyclingExporter)
	return &Tracing{
		recycle:  recycle,
		proc:     newCoalescer(sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithMaxExportBatchSize(exportBatch)), coalesceEvery),
		sampler:  sampler,
		resource: res,
		scope:    instrumentation.Scope{Name: "github.com/infergate/infergate", SchemaURL: semconv.SchemaURL},
	}
}

// TracingFromEnv builds what the standard OTEL_* variables ask for, or returns nil (off, the default) when
// they name no OTLP endpoint: OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (gRPC),
// unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The exporter reads the other OTEL_EXPORTER_OTLP_*
// settings (headers, TLS, timeout); OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (for example
// parentbased_traceidratio with 0.1) choose the sampler, OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES the resource.
func TracingFromEnv(ctx context.Context, version string) (*Tracing, error) {
	if !tracingWanted(os.Getenv) {
		return nil, nil
	}
	if p := cmp.Or(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")); p != "" && p != "grpc" {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: infergate exports traces over OTLP/gRPC only; set grpc", p)
	}
	sampler, err := samplerFromEnv(os.Getenv)
	if err != nil {
		return nil, err
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
	return NewTracing(ExportCopies(exp), sampler, res), nil
}

func tracingWanted(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Shutdown flushes the spans still queued.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.proc.Shutdown(ctx)
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

// Request is one request's trace. Begin reads the client's context as the request arrives; Upstream fixes the
// span's ids and sampling decision when it is routed and gives the headers that make the engine's spans its
// children; End (or Reject) records the span with the instants it was given, after the decision went out. A nil
// *Request traces nothing.
type Request struct {
	t        *Tracing
	parent   trace.SpanContext // the client's, when its traceparent is valid and honoured
	link     trace.SpanContext // the client's, when it is ignored
	op       openai.Endpoint
	started  time.Time
	traceID  trace.TraceID
	spanID   trace.SpanID
	sampling sdktrace.SamplingResult
	decided  bool
	ended    bool
}

// Begin starts following a request from source (its address, "" when unknown) that arrived at started; nil
// (which traces nothing) when t is nil, so that a gateway without tracing carries no trace state per request.
func (t *Tracing) Begin(traceparent, tracestate, source string, ep openai.Endpoint, started time.Time) *Request {
	if t == nil {
		return nil
	}
	r := &Request{t: t, op: ep, started: started}
	if traceparent != "" {
		ctx := propagation.TraceContext{}.Extract(context.Background(), &carrier{traceparent, tracestate})
		if sc := trace.SpanContextFromContext(ctx); t.client.honours(source) {
			r.parent = sc
		} else {
			r.link = sc
		}
	}
	return r
}

// parentContext carries the client's span context, as the sampler and the tracer read it.
func (r *Request) parentContext() context.Context {
	if r.parent.IsValid() {
		return trace.ContextWithRemoteSpanContext(context.Background(), r.parent)
	}
	return context.Background()
}

// decide fixes the span's ids and sampling decision, once.
func (r *Request) decide() {
	if r.decided {
		return
	}
	r.decided = true
	if r.parent.IsValid() {
		r.traceID = r.parent.TraceID()
	} else {
		r.traceID = randomTraceID()
	}
	r.spanID = randomSpanID()
	r.sampling = r.t.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: r.parentContext(),
		TraceID: r.traceID, Name: operation(r.op), Kind: trace.SpanKindClient})
}

func (r *Request) sampled() bool { return r.sampling.Decision == sdktrace.RecordAndSample }

// Upstream is the traceparent and tracestate to send to the engine, so its spans join the request's trace;
// empty when the request is not sampled (the client's own headers then pass through).
func (r *Request) Upstream() (traceparent, tracestate string) {
	if r == nil {
		return "", ""
	}
	r.decide()
	if !r.sampled() {
		return "", ""
	}
	var b [55]byte
	copy(b[:], "00-")
	hex.Encode(b[3:35], r.traceID[:])
	b[35] = '-'
	hex.Encode(b[36:52], r.spanID[:])
	copy(b[52:], "-01")
	if ts := r.sampling.Tracestate; ts.Len() > 0 {
		tracestate = ts.String()
	}
	return string(b[:]), tracestate
}

// TraceID is the request's trace id in hex once routed, "" when it is not sampled (an id no trace store holds
// would only mislead whoever looks it up).
func (r *Request) TraceID() string {
	if r == nil || !r.decided || !r.sampled() {
		return ""
	}
	return r.traceID.String()
}

// span starts the request's span at its arrival; false when it is not to be recorded (not sampled, or recorded
// already). emit hands it on.
func (r *Request) span(name string, attrs int) (tracetest.SpanStub, bool) {
	if r == nil || r.ended {
		return tracetest.SpanStub{}, false
	}
	r.ended = true
	r.decide()
	if !r.sampled() {
		return tracetest.SpanStub{}, false // the batch processor exports sampled spans only
	}
	return tracetest.SpanStub{
		Name: name,
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: r.traceID, SpanID: r.spanID,
			TraceFlags: trace.FlagsSampled, TraceState: r.sampling.Tracestate}),
		Parent:               r.parent,
		Links:                r.links(),
		SpanKind:             trace.SpanKindClient,
		StartTime:            r.started,
		Attributes:           r.t.newAttrs(attrs),
		Resource:             r.t.resource,
		InstrumentationScope: r.t.scope,
	}, true
}

// links links the span to the client's context when that was ignored.
func (r *Request) links() []sdktrace.Link {
	if !r.link.IsValid() {
		return nil
	}
	return []sdktrace.Link{{SpanContext: r.link}}
}

// emit ends the span at ended, failed with code unless code is empty.
func (r *Request) emit(s tracetest.SpanStub, code string, ended time.Time) {
	s.EndTime = ended
	if code != "" {
		s.Attributes = append(s.Attributes, semconv.ErrorTypeKey.String(code))
		s.Status = sdktrace.Status{Code: codes.Error, Description: code}
	}
	r.t.proc.OnEnd(s.Snapshot())
}

// Marks are the instants of a request the span shows as events.
type Marks struct {
	Routed, FirstToken, Ended time.Time
}

// End records the request's span with the GenAI attributes of its settlement and the routed and first-token
// events; a Request records one span at most.
func (r *Request) End(st director.Settlement, m Marks) {
	if r == nil {
		return
	}
	span, ok := r.span(operation(st.Operation)+" "+st.Model, maxSpanAttrs)
	if !ok {
		return
	}
	span.Attributes = append(span.Attributes,
		operationAttr(st.Operation),
		semconv.GenAIRequestModel(st.Model),
		attribute.String("infergate.request_id", st.RequestID),
		attribute.String("infergate.tenant", st.Tenant),
		attribute.String("infergate.tier", st.Tier),
		attribute.String("infergate.outcome", st.Outcome),
		attribute.Bool("infergate.good", st.Good),
		attribute.Float64("infergate.queue.duration", st.Timing.Queued.Seconds()),
	)
	if st.Shadow {
		span.Attributes = append(span.Attributes, attribute.Bool("infergate.shadow", true))
	}
	if st.Routed {
		span.Attributes = appendRoutedAttrs(span.Attributes, st)
		span.Events = marks(r.t.newEvents(), m)
	}
	code := ""
	if st.Outcome != director.OutcomeOK {
		code = st.Outcome
	}
	r.emit(span, code, m.Ended)
}

// maxSpanAttrs is how many attributes End sets at most: eight always, the shadow mark, up to fourteen more when
// routed, the error type.
const maxSpanAttrs = 24

// appendRoutedAttrs adds the attributes of where a routed request went and what it used.
func appendRoutedAttrs(attrs []attribute.KeyValue, st director.Settlement) []attribute.KeyValue {
	attrs = append(attrs,
		semconv.GenAIProviderNameKey.String(st.Provider),
		semconv.GenAIResponseModel(st.ServedModel),
		semconv.GenAIUsageInputTokens(int(st.Usage.PromptTokens)),
		semconv.GenAIUsageOutputTokens(int(st.Usage.CompletionTokens)),
		attribute.String("infergate.pool", st.Pool),
		attribute.String("infergate.hardware_class", st.HardwareClass),
		attribute.Float64("infergate.prefix_match_share", st.PrefixShare),
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
	if a, ok := finishAttrs[st.FinishReason]; ok {
		attrs = append(attrs, a)
	}
	if st.Prefill != "" {
		attrs = append(attrs, attribute.String("infergate.prefill_endpoint", st.Prefill))
	}
	if st.PrefillFailed {
		attrs = append(attrs, attribute.Bool("infergate.prefill_failed", true))
	}
	if st.Region != "" {
		attrs = append(attrs, attribute.String("infergate.region", st.Region))
	}
	if st.From != "" {
		attrs = append(attrs, attribute.String("infergate.edge_region", st.From))
	}
	return attrs
}

// finishAttrs are gen_ai.response.finish_reasons for each finish reason the gateway records, built once: a
// span's attribute costs no allocation.
var finishAttrs = func() map[string]attribute.KeyValue {
	m := map[string]attribute.KeyValue{}
	for _, r := range []string{openai.FinishStop, openai.FinishLength, openai.FinishToolCalls, openai.FinishContentFilter, openai.FinishOther} {
		m[r] = semconv.GenAIResponseFinishReasons(r)
	}
	return m
}()

// marks are the span's events: when it was routed (where to: the span's pool and server attributes) and when
// its first token came.
func marks(events []sdktrace.Event, m Marks) []sdktrace.Event {
	if !m.Routed.IsZero() {
		events = append(events, sdktrace.Event{Name: "routed", Time: m.Routed})
	}
	if !m.FirstToken.IsZero() {
		events = append(events, sdktrace.Event{Name: "first token", Time: m.FirstToken})
	}
	return events
}

// Reject records the span of a request the gateway answered itself before routing it (a bad body, a refusal)
// or whose stream ended first; nothing when the span was recorded already.
func (r *Request) Reject(status int, code string, ended time.Time) {
	if r == nil {
		return
	}
	span, ok := r.span(operation(r.op), 2)
	if !ok {
		return
	}
	if status != 0 {
		span.Attributes = append(span.Attributes, semconv.HTTPResponseStatusCode(status))
	}
	r.emit(span, code, ended)
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
