package shadow

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// keep is an in-memory exporter whose spans survive Shutdown, which flushes them.
type keep struct{ *tracetest.InMemoryExporter }

func (keep) Shutdown(context.Context) error { return nil }

// With tracing on, each copy has a span of its own marked infergate.shadow, naming the baseline request it
// copied and the finish reason of the candidate's answer; the candidate's engine is given the span's context.
func TestACopyIsTracedAsShadow(t *testing.T) {
	var mu sync.Mutex
	var traceparents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		traceparents = append(traceparents, r.Header.Get("traceparent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	mem := tracetest.NewInMemoryExporter()
	tr := telemetry.NewTracing(keep{mem}, nil, nil)
	h := &heard{}
	s := New(Options{Observers: []director.SettleObserver{h}, Tracing: tr})
	c := copyFor(strings.TrimPrefix(srv.URL, "http://"), &policies.ShadowPlan{MaxConcurrent: 4, MaxPerSecond: 10})
	c.RequestID = "req-42"
	if !s.Send(c) {
		t.Fatal("the copy was not sent")
	}
	s.Wait()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := mem.GetSpans()
	if len(spans) != 1 || len(traceparents) != 1 || len(h.all) != 1 {
		t.Fatalf("%d spans, %d copies, %d settlements", len(spans), len(traceparents), len(h.all))
	}
	sp := spans[0]
	if want := "00-" + sp.SpanContext.TraceID().String() + "-" + sp.SpanContext.SpanID().String() + "-01"; traceparents[0] != want {
		t.Errorf("the engine was sent %q, the span is %s", traceparents[0], want)
	}
	attrs := map[attribute.Key]string{}
	for _, kv := range sp.Attributes {
		attrs[kv.Key] = kv.Value.String()
	}
	for k, v := range map[attribute.Key]string{"infergate.shadow": "true", "infergate.request_id": "req-42",
		"gen_ai.response.finish_reasons": `["length"]`, "gen_ai.request.model": "m"} {
		if attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
		}
	}
	if st := h.all[0]; st.FinishReason != "length" || st.RequestID != "req-42" || st.TraceID != sp.SpanContext.TraceID().String() {
		t.Errorf("settlement %+v", st)
	}
}
