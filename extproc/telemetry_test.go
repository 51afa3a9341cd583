package extproc

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// testClock is a clock the test moves; the server reads it from its own goroutine.
type testClock struct{ nanos atomic.Int64 }

func (c *testClock) now() time.Time { return time.Unix(0, c.nanos.Load()) }
func (c *testClock) set(since0 time.Duration) {
	c.nanos.Store(time.Unix(1_000_000, 0).Add(since0).UnixNano())
}

func sseEvent(content string) []byte {
	return fmt.Appendf(nil, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", content)
}

const usageAndDone = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"

// The gateway times a response as it passes: TTFT to the first content chunk, TPOT over the tokens after it,
// the longest gap between chunks and the end. In BUFFERED response mode it sees the body only once whole, so
// TTFT is the end-to-end time and there is no TPOT — and the request is judged on its end-to-end budget.
func TestResponseTimingByMode(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		mode bodyMode
		want director.Timing
	}{
		{"streamed", modeStreamed, director.Timing{TTFT: 100 * ms, TPOT: 50 * ms, MaxITL: 70 * ms, E2E: 210 * ms, Chunked: true}},
		{"full-duplex", modeFullDuplex, director.Timing{TTFT: 100 * ms, TPOT: 50 * ms, MaxITL: 70 * ms, E2E: 210 * ms, Chunked: true}},
		{"buffered", modeBuffered, director.Timing{TTFT: 210 * ms, E2E: 210 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &testClock{}
			clock.set(0)
			snap, err := policies.LoadFile("testdata/policy.yaml")
			if err != nil {
				t.Fatal(err)
			}
			h := newHarnessWith(t, snap, config{Options: Options{Now: clock.now, DigestKey: testDigestKey}})
			s := h.open(t, modeFullDuplex, tc.mode)
			body := `{"model":"qwen2.5-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			s.send(postHeaders("/v1/chat/completions", keyAcme))
			s.send(reqBody([]byte(body), true))
			s.recv()
			s.recvStreamed(true, 4)
			clock.set(90 * ms)
			s.send(respHeaders("200", false, "content-type", "text/event-stream"))
			s.recv()
			chunks := []struct {
				at   time.Duration
				data []byte
			}{{100 * ms, sseEvent("Hel")}, {130 * ms, sseEvent("lo")}, {200 * ms, sseEvent("!")}, {210 * ms, []byte(usageAndDone)}}
			if tc.mode == modeBuffered {
				var whole []byte
				for _, c := range chunks {
					whole = append(whole, c.data...)
				}
				clock.set(210 * ms)
				s.send(respBody(whole, true))
				s.recv()
			} else {
				for i, c := range chunks {
					clock.set(c.at)
					s.send(respBody(c.data, i == len(chunks)-1))
					s.recv() // one answer per chunk in both modes here: each chunk ends its events
				}
			}
			st := h.settlement()
			if st.Timing != tc.want {
				t.Errorf("timing %+v, want %+v", st.Timing, tc.want)
			}
			prompt, output := keyedDigest(`[{"role":"user","content":"hi"}]`), keyedDigest("Hello!")
			if st.PromptDigest != prompt || st.OutputDigest != output || st.DigestKey != testDigestKey.ID {
				t.Errorf("digests %s / %s under %q, want the prompt's and \"Hello!\"'s under %q", st.PromptDigest,
					st.OutputDigest, st.DigestKey, testDigestKey.ID)
			}
		})
	}
}

// traceReceiver is an OTLP/gRPC trace collector: the spans an exporter sends arrive here as they would at an
// OpenTelemetry Collector.
type traceReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string // service.name of each span's resource
	scopes   []string // instrumentation scope name of each span
}

func (r *traceReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
			for range ss.GetSpans() {
				r.services = append(r.services, service)
				r.scopes = append(r.scopes, ss.GetScope().GetName())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *traceReceiver) received() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

func startTraceReceiver(t *testing.T) (*traceReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &traceReceiver{}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return r, lis.Addr().String()
}

func spanAttrs(s *tracepb.Span) map[string]string {
	out := map[string]string{}
	for _, kv := range s.GetAttributes() {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_ArrayValue:
			var vs []string
			for _, e := range x.ArrayValue.GetValues() {
				vs = append(vs, e.GetStringValue())
			}
			out[kv.GetKey()] = "[" + strings.Join(vs, ",") + "]"
		default:
			out[kv.GetKey()] = fmt.Sprint(v.GetValue())
		}
	}
	return out
}

// Traces configured by the standard OTEL_* variables reach a real OTLP receiver: the request's span is a child
// of the client's traceparent, carries the GenAI attributes, and its context goes upstream so the engine's spans
// join the trace.
func TestTracesReachAnOTLPReceiver(t *testing.T) {
	recv, addr := startTraceReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "1")
	tracing, err := telemetry.TracingFromEnv(context.Background(), "test")
	if err != nil || tracing == nil {
		t.Fatalf("TracingFromEnv = %v, %v", tracing, err)
	}
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{Options: Options{Tracing: tracing}})
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	s := h.open(t, modeFullDuplex, modeStreamed)
	s.send(postHeaders("/v1/chat/completions", keyAcme, "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01"))
	s.send(reqBody([]byte(`{"model":"qwen2.5-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true))
	hdrs := setHeaders(s.recv().GetRequestHeaders().GetResponse().GetHeaderMutation())
	s.recvStreamed(true, 4)
	up := strings.Split(hdrs["traceparent"], "-")
	if len(up) != 4 || up[1] != clientTrace || up[2] == clientSpan {
		t.Fatalf("upstream traceparent %q: want the client's trace with the gateway's span", hdrs["traceparent"])
	}
	s.send(respHeaders("200", false, "content-type", "text/event-stream"))
	s.recv()
	s.send(respBody(append(sseEvent("ok"), "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"+usageAndDone...), true))
	s.recv()
	st := h.settlement()
	if st.FinishReason != "length" {
		t.Errorf("settlement finish reason %q, want length", st.FinishReason)
	}
	// The span ends just after the settlement, once the last answer is sent; the stream closes after that.
	s.expectClosed()
	if st.TraceID != clientTrace {
		t.Errorf("settlement trace id %q", st.TraceID)
	}
	// A refused request is traced too, as an error.
	r := h.open(t, modeFullDuplex, modeStreamed)
	r.send(postHeaders("/v1/chat/completions", keyAcme))
	r.send(reqBody([]byte(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`), true))
	r.recv()
	// A models list is not a GenAI operation: no span.
	ml := h.open(t, modeBuffered, modeNone)
	ml.send(reqHeaders(true, ":method", "GET", ":path", "/v1/models", "authorization", "Bearer "+keyAcme))
	if code := ml.recv().GetImmediateResponse().GetStatus().GetCode(); code != 200 {
		t.Fatalf("models list: %v", code)
	}
	ml.expectClosed()
	if err := tracing.Shutdown(context.Background()); err != nil { // flushes the batch
		t.Fatal(err)
	}
	spans := recv.received()
	if len(spans) != 2 {
		t.Fatalf("receiver got %d spans, want 2", len(spans))
	}
	span := spans[0]
	if hex.EncodeToString(span.GetTraceId()) != clientTrace || hex.EncodeToString(span.GetParentSpanId()) != clientSpan ||
		hex.EncodeToString(span.GetSpanId()) != up[2] {
		t.Errorf("span %x parent %x in trace %x: want child of the client's span, the one sent upstream", span.GetSpanId(),
			span.GetParentSpanId(), span.GetTraceId())
	}
	if span.GetName() != "chat qwen2.5-7b" || span.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("span %q kind %v", span.GetName(), span.GetKind())
	}
	attrs := spanAttrs(span)
	for k, v := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "sglang", "gen_ai.request.model": "qwen2.5-7b", "gen_ai.response.model": "qwen2.5-7b",
		"gen_ai.usage.input_tokens": "4", "gen_ai.usage.output_tokens": "3",
		"server.address": "10.0.1.11", "infergate.tenant": "acme", "infergate.pool": "qwen7b-l40s",
		"infergate.hardware_class": "l40s", "infergate.outcome": "ok", "gen_ai.response.finish_reasons": "[length]",
	} {
		if attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
		}
	}
	for _, k := range []string{"infergate.tier", "infergate.prefix_match_share", "infergate.queue.duration"} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("attribute %s missing", k)
		}
	}
	var events []string
	for _, e := range span.GetEvents() {
		events = append(events, e.GetName())
	}
	if strings.Join(events, ",") != "routed,first token" {
		t.Errorf("events %v, want routed and first token", events)
	}
	if refused := spans[1]; refused.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		spanAttrs(refused)["error.type"] != "model_not_found" {
		t.Errorf("the refused request's span has status %v, attributes %v", refused.GetStatus(), spanAttrs(refused))
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for i := range spans {
		if recv.services[i] != "infergate" || recv.scopes[i] != "github.com/infergate/infergate" {
			t.Errorf("span %d: service %q scope %q, want infergate's", i, recv.services[i], recv.scopes[i])
		}
	}
}

// Without an OTLP endpoint in the environment, tracing stays off.
func TestTracingOffByDefault(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if tr, err := telemetry.TracingFromEnv(context.Background(), "test"); tr != nil || err != nil {
		t.Errorf("TracingFromEnv without endpoint = %v, %v", tr, err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tr, _ := telemetry.TracingFromEnv(context.Background(), "test"); tr != nil {
		t.Error("OTEL_SDK_DISABLED=true still traces")
	}
}

// What the client receives does not depend on telemetry: the same upstream stream, cut the same way, comes
// out byte for byte the same with digests, tracing and observers on as with them off.
func TestStreamIsByteIdenticalWithTelemetry(t *testing.T) {
	sse, err := os.ReadFile("../openai/testdata/vllm-chat-stream.sse")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startTraceReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+addr)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	tracing, err := telemetry.TracingFromEnv(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tracing.Shutdown(context.Background()) })
	off := newHarnessWith(t, snap, config{})
	on := newHarnessWith(t, snap, config{Options: Options{DigestKey: testDigestKey, Tracing: tracing},
		Director: director.Options{Observers: []director.SettleObserver{telemetry.NewMetrics(nil)}}})
	for _, mode := range []bodyMode{modeStreamed, modeFullDuplex} {
		for _, cuts := range [][]int{{}, {7}, {100, 101, 102}, {len(sse) - 30}} {
			forward := func(h *harness) []byte {
				s := streamChat(t, h, mode)
				s.send(respHeaders("200", false, "content-type", "text/event-stream"))
				s.recv()
				chunks := cutBody(sse, cuts)
				var out []byte
				for i, c := range chunks {
					s.send(respBody(c, i == len(chunks)-1))
					if mode == modeStreamed {
						out = s.forwardedChunk(out, c)
					}
				}
				if mode == modeFullDuplex {
					out = append(out, s.recvStreamed(false, 64)...)
				}
				h.settlement()
				return out
			}
			if a, b := forward(off), forward(on); !bytes.Equal(a, b) || len(a) == 0 {
				t.Errorf("%v %v: the client's bytes differ with telemetry on (%d vs %d bytes)", mode, cuts, len(b), len(a))
			}
		}
	}
}

// testDigestKey keys the digests in tests.
var testDigestKey, _ = audit.NewDigestKey([]byte("a test key of thirty-two bytes or more"))

// keyedDigest is what the audit log's digest of text must be: HMAC-SHA256 under testDigestKey, computed here
// with the standard library rather than by the code under test.
func keyedDigest(text string) string {
	mac := hmac.New(sha256.New, []byte("a test key of thirty-two bytes or more"))
	mac.Write([]byte(text))
	return hex.EncodeToString(mac.Sum(nil))
}
