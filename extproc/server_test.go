package extproc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/wait"
)

const chatBody = `{"model":"llama-70b","messages":[{"role":"system","content":"Tu es un assistant. Réponds en français."},{"role":"user","content":"Bonjour ✓"}],"max_tokens":32}`

var llamaEndpoints = []string{"10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000"}

// checkRouting asserts the contract headers of a routing decision and returns the destination list.
func checkRouting(t *testing.T, set map[string]string, r *extprocv3.ProcessingResponse, model, pool string) []string {
	t.Helper()
	if set[contract.HeaderModel] != model || set[contract.HeaderPool] != pool {
		t.Errorf("model/pool headers = %q/%q, want %q/%q", set[contract.HeaderModel], set[contract.HeaderPool], model, pool)
	}
	dest := set[contract.HeaderDestination]
	if dest == "" || dest != lbDestination(r) {
		t.Errorf("destination header %q and envoy.lb metadata %q must be equal and set", dest, lbDestination(r))
	}
	return strings.Split(dest, ",")
}

func TestBufferedChatRouting(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeBuffered, modeStreamed)
	s.send(postHeaders("/v1/chat/completions", keyAcme,
		"content-length", strconv.Itoa(len(chatBody)),
		"x-gateway-destination-endpoint", "6.6.6.6:22", "X-Infergate-Pool", "evil", "x-infergate-tenant", "root",
		"x-prefiller-host-port", "169.254.169.254:80", "x-kv-cache-source-host-port", "10.9.9.9:8000",
		"x-infergate-residency", "anywhere"))
	// BUFFERED: headers are answered at once (Envoy only then sends the body), forged headers removed.
	hr := s.recv().GetRequestHeaders()
	if hr == nil {
		t.Fatal("expected a request_headers response")
	}
	removed := sorted(hr.GetResponse().GetHeaderMutation().GetRemoveHeaders())
	// llm-d's prefill/decode headers too: a decode pod's routing sidecar would send the prompt to that address.
	for _, want := range []string{"authorization", "x-gateway-destination-endpoint", "x-infergate-pool", "x-infergate-tenant",
		"x-prefiller-host-port", "x-kv-cache-source-host-port", "x-infergate-residency"} {
		if !slices.Contains(removed, want) {
			t.Errorf("header %q not removed (removed %v)", want, removed)
		}
	}
	if hr.GetResponse().GetClearRouteCache() {
		t.Error("clear_route_cache without a routing header mutation is pointless")
	}

	s.send(reqBody([]byte(chatBody), true))
	r := s.recv()
	br := r.GetRequestBody().GetResponse()
	if br == nil {
		t.Fatalf("expected a request_body response, got %v", r)
	}
	if !br.GetClearRouteCache() || br.GetHeaderMutation() == nil {
		t.Error("routing headers must come with clear_route_cache in the same response")
	}
	set := setHeaders(br.GetHeaderMutation())
	dest := checkRouting(t, set, r, "llama-3.3-70b", "llama70b-h200")
	if len(dest) != 2 || !slices.Contains(llamaEndpoints, dest[0]) || dest[0] == dest[1] {
		t.Errorf("destination list %v: want 2 distinct pool endpoints", dest)
	}
	if set[contract.HeaderTenant] != "acme" {
		t.Errorf("tenant header = %q", set[contract.HeaderTenant])
	}
	if r, ok := set[contract.HeaderResidency]; ok {
		t.Errorf("a tenant pinned to no region got residency %q", r)
	}
	if set[contract.HeaderRequestID] == "" {
		t.Error("x-request-id not generated")
	}
	body := br.GetBodyMutation().GetBody()
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil || doc["model"] != "meta-llama/Llama-3.3-70B-Instruct" {
		t.Fatalf("body not rewritten to the served model: %s", body)
	}
	if set["content-length"] != strconv.Itoa(len(body)) {
		t.Errorf("content-length = %s, body is %d bytes", set["content-length"], len(body))
	}
	if !strings.Contains(string(body), "Réponds en français") {
		t.Error("prompt bytes changed")
	}
	if h.inflight.Count(dest[0]) != 1 {
		t.Errorf("in-flight at %s = %d, want 1", dest[0], h.inflight.Count(dest[0]))
	}

	// Response path: JSON body with usage.
	s.send(respHeaders("200", false, "content-type", "application/json"))
	if s.recv().GetResponseHeaders() == nil {
		t.Fatal("expected a response_headers response")
	}
	fixture, _ := os.ReadFile("../openai/testdata/vllm-chat-completion.json")
	s.send(respBody(fixture[:40], false))
	if mut := s.recv().GetResponseBody().GetResponse().GetBodyMutation(); mut != nil {
		t.Errorf("non-streaming body must pass unchanged, got %v", mut)
	}
	s.send(respBody(fixture[40:], true))
	s.recv()
	st := h.settlement()
	if st.Result != "completed" || !st.Reported || st.Usage.PromptTokens != 6 || st.Usage.CompletionTokens != 1 || st.Tenant != "acme" {
		t.Errorf("settlement = %+v", st)
	}
	if want := (6*0.20 + 1*0.60) / 1e6; math.Abs(st.CostUSD-want) > 1e-15 {
		t.Errorf("cost = %v, want %v", st.CostUSD, want)
	}
	s.expectClosed()
	if h.inflight.Total() != 0 {
		t.Errorf("in-flight total = %d after completion", h.inflight.Total())
	}
	h.noSettlement()
}

// splitPoints are awkward places to cut a body: inside a UTF-8 sequence, a key, an escape, and single bytes.
func splitPoints(body []byte) [][]int {
	utf8 := bytes.Index(body, []byte("é")) + 1
	key := bytes.Index(body, []byte(`"model"`)) + 3
	return [][]int{
		{},
		{1},
		{utf8},
		{key, utf8},
		{len(body) - 1},
		{1, 2, 3, key, utf8, len(body) - 2},
	}
}

func cutBody(body []byte, cuts []int) [][]byte {
	var chunks [][]byte
	prev := 0
	for _, c := range append(slices.Clone(cuts), len(body)) {
		if c > prev {
			chunks = append(chunks, body[prev:c])
			prev = c
		}
	}
	return chunks
}

func TestFullDuplexChatSplitBodies(t *testing.T) {
	h := newHarness(t)
	for i, cuts := range splitPoints([]byte(chatBody)) {
		t.Run(fmt.Sprint(cuts), func(t *testing.T) {
			s := h.open(t, modeFullDuplex, modeFullDuplex)
			s.send(postHeaders("/v1/chat/completions", keyAcme, "x-request-id", "req-"+strconv.Itoa(i), "x-gateway-destination-endpoint", "6.6.6.6:1"))
			chunks := cutBody([]byte(chatBody), cuts)
			for j, c := range chunks {
				s.send(reqBody(c, j == len(chunks)-1))
			}
			// FULL_DUPLEX_STREAMED: the headers answer is deferred until the body is complete.
			r := s.recv()
			hr := r.GetRequestHeaders().GetResponse()
			if hr == nil || !hr.GetClearRouteCache() {
				t.Fatalf("first answer must be the deferred headers response with clear_route_cache, got %v", r)
			}
			set := setHeaders(hr.GetHeaderMutation())
			checkRouting(t, set, r, "llama-3.3-70b", "llama70b-h200")
			if _, ok := set[contract.HeaderRequestID]; ok {
				t.Error("an existing x-request-id must be kept, not replaced")
			}
			if !slices.Contains(hr.GetHeaderMutation().GetRemoveHeaders(), "authorization") {
				t.Error("authorization not removed")
			}
			got := s.recvStreamed(true, 4)
			if set["content-length"] != strconv.Itoa(len(got)) {
				t.Errorf("content-length %s for a %d-byte body", set["content-length"], len(got))
			}
			var doc map[string]any
			if err := json.Unmarshal(got, &doc); err != nil || doc["model"] != "meta-llama/Llama-3.3-70B-Instruct" {
				t.Fatalf("streamed body = %s", got)
			}
			s.send(respHeaders("200", true))
			s.recv()
			if st := h.settlement(); st.RequestID != "req-"+strconv.Itoa(i) {
				t.Errorf("settlement request id = %q", st.RequestID)
			}
		})
	}
}

func TestFullDuplexLargeBodyIsChunked(t *testing.T) {
	h := newHarness(t)
	prompt := strings.Repeat("lorem ipsum ", 256<<10/12)
	body := []byte(`{"model":"qwen2.5-7b","max_tokens":16,"messages":[{"role":"user","content":"` + prompt + `"}]}`)
	s := h.open(t, modeFullDuplex, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	for off := 0; off < len(body); off += 16384 { // Envoy forwards data frames as they arrive
		end := min(off+16384, len(body))
		s.send(reqBody(body[off:end], end == len(body)))
	}
	r := s.recv()
	checkRouting(t, setHeaders(r.GetRequestHeaders().GetResponse().GetHeaderMutation()), r, "qwen2.5-7b", "qwen7b-l40s")
	var got []byte
	chunks, ended := 0, false
	for !ended && chunks <= len(body)/streamChunkBytes+1 { // bounded: a missing end fails here, not at the deadline
		sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if len(sr.GetBody()) > streamChunkBytes {
			t.Fatalf("chunk of %d bytes exceeds %d", len(sr.GetBody()), streamChunkBytes)
		}
		got = append(got, sr.GetBody()...)
		chunks++
		ended = sr.GetEndOfStream()
	}
	if !ended {
		t.Fatalf("no end_of_stream after %d chunks", chunks)
	}
	if !bytes.Equal(got, body) {
		t.Error("body changed although the pool serves the requested name")
	}
	if want := (len(body) + streamChunkBytes - 1) / streamChunkBytes; chunks != want {
		t.Errorf("%d chunks, want %d", chunks, want)
	}
	// Response body mode NONE: response headers are the last message; settle there.
	s.send(respHeaders("200", false))
	s.recv()
	if st := h.settlement(); st.Reported || st.Usage.PromptTokens == 0 {
		t.Errorf("without a response body the prompt must be estimated: %+v", st)
	}
}

func TestFullDuplexWithTrailers(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeFullDuplex, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	s.send(reqBody([]byte(chatBody), false)) // trailers follow
	s.send(reqTrailers())
	if s.recv().GetRequestHeaders() == nil {
		t.Fatal("want headers response first")
	}
	sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil || !sr.GetEndOfStream() {
		t.Fatalf("want the whole body with end_of_stream, got %v", sr)
	}
	if s.recv().GetRequestTrailers() == nil {
		t.Fatal("want a trailers response")
	}
}

func TestErrorPaths(t *testing.T) {
	h := newHarness(t)
	big := `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<20) + `"}]}`
	tests := []struct {
		name       string
		modes      []bool // buffered, full duplex
		headers    *extprocv3.ProcessingRequest
		body       string // sent when the headers were accepted
		wantStatus int
		wantCode   string
	}{
		{"no key", nil, postHeaders("/v1/chat/completions", ""), "", 401, "invalid_api_key"},
		{"unknown key", nil, postHeaders("/v1/chat/completions", "sk-nope"), "", 401, "invalid_api_key"},
		{"basic auth", nil, postHeaders("/v1/chat/completions", "", "authorization", "Basic Zm9vOmJhcg=="), "", 401, "invalid_api_key"},
		{"unknown path", nil, postHeaders("/v1/images/generations", keyAcme), "", 404, "unknown_url"},
		{"GET on chat", nil, reqHeaders(true, ":method", "GET", ":path", "/v1/chat/completions", "authorization", "Bearer "+keyAcme), "", 405, "method_not_allowed"},
		{"no body", nil, reqHeaders(true, ":method", "POST", ":path", "/v1/chat/completions", "authorization", "Bearer "+keyAcme), "", 400, "invalid_request"},
		{"content-length over limit", nil, postHeaders("/v1/chat/completions", keyAcme, "content-length", "2000000"), "", 413, "request_too_large"},
		{"body over limit", nil, postHeaders("/v1/chat/completions", keyAcme), big, 413, "request_too_large"},
		{"malformed JSON", nil, postHeaders("/v1/chat/completions", keyAcme), `{"model":`, 400, "invalid_request"},
		{"missing messages", nil, postHeaders("/v1/chat/completions", keyAcme), `{"model":"llama-70b"}`, 400, "invalid_request"},
		{"missing input", nil, postHeaders("/v1/embeddings", keyAcme), `{"model":"llama-70b","prompt":"x"}`, 400, "invalid_request"},
		{"unknown model", nil, postHeaders("/v1/chat/completions", keyAcme), `{"model":"gpt-5","messages":[{}]}`, 404, "model_not_found"},
		{"model not allowed", nil, postHeaders("/v1/completions", keyInitech), `{"model":"llama-3.3-70b","prompt":"x"}`, 403, "model_not_allowed"},
	}
	for _, tc := range tests {
		for _, mode := range []struct {
			name string
			m    any
		}{{"buffered", modeBuffered}, {"full-duplex", modeFullDuplex}} {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				reqMode := modeBuffered
				if mode.name == "full-duplex" {
					reqMode = modeFullDuplex
				}
				s := h.open(t, reqMode, modeNone)
				s.send(tc.headers)
				if tc.body != "" {
					if reqMode == modeBuffered {
						if s.recv().GetRequestHeaders() == nil {
							t.Fatal("want headers response before the body")
						}
					}
					// Envoy streams a body in frames; send it in two.
					half := len(tc.body) / 2
					if reqMode == modeFullDuplex {
						s.send(reqBody([]byte(tc.body[:half]), false))
						s.send(reqBody([]byte(tc.body[half:]), true))
					} else {
						s.send(reqBody([]byte(tc.body), true))
					}
				}
				status, code := immediateError(t, s.recv())
				if status != tc.wantStatus || code != tc.wantCode {
					t.Errorf("got %d %q, want %d %q", status, code, tc.wantStatus, tc.wantCode)
				}
				s.expectClosed()
			})
		}
	}
	h.noSettlement()
	if h.inflight.Total() != 0 {
		t.Errorf("rejected requests left %d in flight", h.inflight.Total())
	}
}

func TestUnsupportedBodyModeIsAClearError(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeStreamed, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	status, _ := immediateError(t, s.recv())
	if status != 500 {
		t.Errorf("status = %d", status)
	}
}

func TestModelsList(t *testing.T) {
	h := newHarness(t)
	for key, want := range map[string][]string{keyAcme: {"llama-3.3-70b", "llama-70b", "qwen2.5-7b"}, keyInitech: {"qwen2.5-7b"}} {
		s := h.open(t, modeBuffered, modeNone)
		s.send(reqHeaders(true, ":method", "GET", ":path", "/v1/models", "authorization", "Bearer "+key))
		ir := s.recv().GetImmediateResponse()
		if ir.GetStatus().GetCode() != 200 {
			t.Fatalf("status %v", ir.GetStatus())
		}
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID     string `json:"id"`
				Object string `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ir.GetBody(), &list); err != nil || list.Object != "list" {
			t.Fatalf("bad list %s: %v", ir.GetBody(), err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("models for %s = %v, want %v", key, ids, want)
		}
		s.expectClosed()
	}
}

// streamChat opens a streaming chat request without include_usage and checks the request was rewritten to ask for it.
// forwardedChunk reads the STREAMED answer to one response chunk — exactly one per chunk, in order — and appends
// what Envoy forwards in its place: the chunk itself, or the mutation that replaces it.
func (s *stream) forwardedChunk(out, chunk []byte) []byte {
	s.t.Helper()
	switch m := s.recv().GetResponseBody().GetResponse().GetBodyMutation(); {
	case m == nil:
		return append(out, chunk...)
	case m.GetClearBody():
		return out
	default:
		return append(out, m.GetBody()...)
	}
}

func streamChat(t *testing.T, h *harness, respMode any) *stream {
	t.Helper()
	rm := modeStreamed
	if respMode == modeFullDuplex {
		rm = modeFullDuplex
	}
	s := h.open(t, modeFullDuplex, rm)
	body := `{"model":"qwen2.5-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	s.send(reqBody([]byte(body), true))
	s.recv() // headers
	sr := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	var doc struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(sr.GetBody(), &doc); err != nil || !doc.StreamOptions.IncludeUsage {
		t.Fatalf("include_usage not injected: %s", sr.GetBody())
	}
	return s
}

func TestStreamingUsageAcrossChunkBoundaries(t *testing.T) {
	sse, err := os.ReadFile("../openai/testdata/vllm-chat-stream.sse")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	for _, mode := range []string{"streamed", "full-duplex"} {
		for _, cuts := range [][]int{{}, {5}, {100, 101, 102}, {len(sse) - 30}, {len(sse) - 250, len(sse) - 20}} {
			t.Run(fmt.Sprint(mode, cuts), func(t *testing.T) {
				var rm any = modeStreamed
				if mode == "full-duplex" {
					rm = modeFullDuplex
				}
				s := streamChat(t, h, rm)
				s.send(respHeaders("200", false, "content-type", "text/event-stream"))
				if rh := s.recv().GetResponseHeaders(); !slices.Contains(rh.GetResponse().GetHeaderMutation().GetRemoveHeaders(), "content-length") {
					t.Error("content-length must go when the gateway shortens the stream")
				}
				chunks := cutBody(sse, cuts)
				var forwarded []byte
				for i, c := range chunks {
					end := i == len(chunks)-1
					s.send(respBody(c, end))
					if mode == "streamed" {
						forwarded = s.forwardedChunk(forwarded, c)
						continue
					}
				}
				if mode == "full-duplex" {
					// FULL_DUPLEX_STREAMED: answers are decoupled from chunks; read until end_of_stream.
					forwarded = append(forwarded, s.recvStreamed(false, 64)...)
				}
				if mode == "full-duplex" && len(forwarded) == 0 {
					t.Fatal("nothing forwarded")
				}
				if bytes.Contains(forwarded, []byte(`"choices":[]`)) {
					t.Error("the usage chunk the client did not ask for reached it")
				}
				if !bytes.Contains(forwarded, []byte("data: [DONE]")) || !bytes.Contains(forwarded, []byte(`"content":"To "`)) {
					t.Errorf("stream content lost: %q", forwarded)
				}
				st := h.settlement()
				if !st.Reported || st.Usage.PromptTokens != 26 || st.Usage.CompletionTokens != 1 || st.Usage.CachedTokens != 16 {
					t.Errorf("settlement usage = %+v (reported %v)", st.Usage, st.Reported)
				}
			})
		}
	}
}

func TestAbortMidStreamSettlesOnce(t *testing.T) {
	h := newHarness(t)
	s := streamChat(t, h, modeStreamed)
	s.send(respHeaders("200", false))
	s.recv()
	s.send(respBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"), false))
	s.recv()
	if h.inflight.Total() != 1 {
		t.Fatalf("in flight = %d before abort", h.inflight.Total())
	}
	s.cancel() // the client went away: Envoy resets the stream
	st := h.settlement()
	if st.Result != "aborted" || st.Usage.PromptTokens == 0 || st.Usage.CompletionTokens != 1 {
		t.Errorf("settlement = %+v (the one content chunk sent must be charged)", st)
	}
	wait.For(t, "in-flight count back to zero", func() bool { return h.inflight.Total() == 0 })
	h.noSettlement()
}

func TestUpstreamErrorSettles(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeBuffered, modeBuffered)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	s.recv()
	s.send(reqBody([]byte(chatBody), true))
	s.recv()
	s.send(respHeaders("503", false))
	s.recv()
	s.send(respBody([]byte(`{"error":{"message":"overloaded"}}`), true))
	s.recv()
	if st := h.settlement(); st.Result != "upstream_error" || st.Status != 503 || st.CostUSD != 0 {
		t.Errorf("settlement = %+v", st)
	}
}

// Concurrent requests with one prefix go to the endpoint that has it, until bounded load spreads them (an
// endpoint holding the prefix may carry (1+2ε) × the mean, +1: picker.hitSlackFactor).
func TestRoutingSpreadsLoadUnderBoundedLoad(t *testing.T) {
	h := newHarness(t)
	seen := map[string]int{}
	var open []*stream
	for range 6 {
		s := h.open(t, modeBuffered, modeNone)
		s.send(postHeaders("/v1/chat/completions", keyAcme))
		s.recv()
		s.send(reqBody([]byte(chatBody), true))
		set := setHeaders(s.recv().GetRequestBody().GetResponse().GetHeaderMutation())
		seen[strings.Split(set[contract.HeaderDestination], ",")[0]]++
		open = append(open, s)
	}
	most := 0
	for _, n := range seen {
		most = max(most, n)
	}
	if len(seen) < 2 || most > 4 || most < 2 {
		t.Errorf("six concurrent same-prefix requests went to %v; want affinity first, then spreading", seen)
	}
	for _, s := range open {
		s.send(respHeaders("200", true))
		s.recv()
		h.settlement()
	}
}

func TestHealthServices(t *testing.T) {
	h := newHarness(t)
	hc := healthpb.NewHealthClient(h.conn)
	for _, name := range HealthServices {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, %v", name, resp.GetStatus(), err)
		}
	}
	_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "nope"})
	if codeOf(err) != codes.NotFound {
		t.Errorf("unknown service: %v", err)
	}
}

type allSaturated struct{}

func (allSaturated) Metrics(string) (fleet.EngineMetrics, bool) {
	return fleet.EngineMetrics{Waiting: 1000}, true
}

// When every replica is saturated, the request goes to the model's managed fallback: the pool header names
// it, the body carries the provider's model name, and no replica endpoint is named.
func TestOverflowToManagedFallback(t *testing.T) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{Director: director.Options{Engines: allSaturated{}}})

	s := h.open(t, modeBuffered, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	s.recv()
	s.send(reqBody([]byte(chatBody), true))
	r := s.recv()
	br := r.GetRequestBody().GetResponse()
	set := setHeaders(br.GetHeaderMutation())
	if set[contract.HeaderPool] != "fallback/together" || set[contract.HeaderDestination] != "" || r.GetDynamicMetadata() != nil {
		t.Errorf("headers %v, metadata %v", set, r.GetDynamicMetadata())
	}
	if body := string(br.GetBodyMutation().GetBody()); !strings.Contains(body, `"meta-llama/Llama-3.3-70B-Instruct-Turbo"`) {
		t.Errorf("body not rewritten to the provider's model: %s", body)
	}
	// qwen has no fallback: saturation sheds with 429.
	s2 := h.open(t, modeBuffered, modeNone)
	s2.send(postHeaders("/v1/chat/completions", keyAcme))
	s2.recv()
	s2.send(reqBody([]byte(`{"model":"qwen2.5-7b","messages":[{"role":"user","content":"hi"}]}`), true))
	if status, code := immediateError(t, s2.recv()); status != 429 || code != "model_overloaded" {
		t.Errorf("got %d %q", status, code)
	}
}

// FULL_DUPLEX_STREAMED response that ends with trailers: the body's end must still be sent before the trailers
// answer, or Envoy never finishes the response.
func TestFullDuplexJSONResponseWithTrailers(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeFullDuplex, modeFullDuplex)
	s.send(postHeaders("/v1/chat/completions", keyAcme))
	s.send(reqBody([]byte(chatBody), true))
	for !s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
	}
	s.send(respHeaders("200", false))
	s.recv()
	s.send(respBody([]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":2}}`), false))
	if sr := s.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || sr.GetEndOfStream() {
		t.Fatalf("first chunk %v", sr)
	}
	s.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	sr := s.recv().GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
	if sr == nil || !sr.GetEndOfStream() {
		t.Fatalf("want the body's end before the trailers answer, got %v", sr)
	}
	if s.recv().GetResponseTrailers() == nil {
		t.Fatal("no trailers answer")
	}
	if st := h.settlement(); !st.Reported || st.Usage.CompletionTokens != 2 {
		t.Errorf("settlement %+v", st)
	}
}

// A client that closes its connection on `data: [DONE]` had the whole answer: the stream ending before the
// body's last empty chunk settles as completed, not as a reset.
func TestStreamClosedAfterDoneIsComplete(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string
	}{
		{"after [DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", "completed"},
		{"before [DONE]", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", "aborted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			s := streamChat(t, h, modeStreamed)
			s.send(respHeaders("200", false))
			s.recv()
			s.send(respBody([]byte(tc.body), false))
			s.recv()
			s.cancel()
			if st := h.settlement(); st.Result != tc.want {
				t.Errorf("result %q, want %q", st.Result, tc.want)
			}
		})
	}
}
