package extproc

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/wait"
)

// Requests a hostile tenant sends with a valid key: each ends in a clear 4xx, and the server goes on serving.
func TestHostileBodiesAreRefused(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name, body string
		status     int
		wantMsg    string
	}{
		{"a hundred thousand brackets", `{"model":"qwen2.5-7b","messages":` + strings.Repeat("[", 100_000), 400, "nesting deeper"},
		{"max_tokens near 2^63", `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775807}`, 400, "max_tokens is too large"},
		{"max_tokens beyond the context", `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"x"}],"max_tokens":131073}`, 400, "max_tokens is too large"},
		{"max_tokens zero", `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "positive integer"},
		{"duplicate model keys", `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"x"}],"model":"llama-70b"}`, 400, "repeats the key 'model'"},
		{"control character before an escape", "{\"model\":\"qwen2.5-7b\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\\n\"}]}", 400, "control character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, r := post(t, h, keyAcme, tc.body, modeNone)
			status, _ := immediateError(t, r)
			if status != tc.status {
				t.Fatalf("status %d, want %d", status, tc.status)
			}
			if msg := string(r.GetImmediateResponse().GetBody()); !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("body %.200s does not say %q", msg, tc.wantMsg)
			}
		})
	}
	// Still serving.
	if _, r := post(t, h, keyAcme, chatBody, modeNone); r.GetRequestBody() == nil {
		t.Fatalf("not routed after hostile requests: %v", r)
	}
}

// A request without max_tokens is bounded by the policy's default, written into the body, so that the engine
// cannot produce more than admission reserved.
func TestMaxTokensInjectedWhenAbsent(t *testing.T) {
	h := newHarness(t)
	_, r := post(t, h, keyAcme, `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"hi"}]}`, modeNone)
	body := r.GetRequestBody().GetResponse().GetBodyMutation().GetBody()
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("no rewritten body: %v (%v)", err, r)
	}
	if doc["max_tokens"] != float64(256) {
		t.Errorf("max_tokens = %v, want the policy default 256", doc["max_tokens"])
	}
	if cl := setHeaders(r.GetRequestBody().GetResponse().GetHeaderMutation())["content-length"]; cl != strconv.Itoa(len(body)) {
		t.Errorf("content-length %q for a %d-byte body", cl, len(body))
	}
	// A client's own bound is kept as sent.
	_, r = post(t, h, keyAcme, `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"hi"}],"max_tokens":7}`, modeNone)
	if b := r.GetRequestBody().GetResponse().GetBodyMutation().GetBody(); b != nil {
		t.Errorf("body rewritten although the client bounded it: %s", b)
	}
}

// An upstream that reports absurd usage is charged at the model's context, never at 2^63.
func TestAbsurdUpstreamUsageIsClamped(t *testing.T) {
	h := newHarness(t)
	s, _ := post(t, h, keyAcme, chatBody, modeBuffered)
	s.send(respHeaders("200", false, "content-type", "application/json"))
	s.recv()
	s.send(respBody([]byte(`{"choices":[],"usage":{"prompt_tokens":9223372036854775000,"completion_tokens":9223372036854775000}}`), true))
	s.recv()
	st := h.settlement()
	if st.Usage.PromptTokens > 131072 || st.Usage.CompletionTokens > 131072 {
		t.Errorf("usage not clamped: %+v", st.Usage)
	}
	if math.IsInf(st.CostUSD, 0) || st.CostUSD > 1000 {
		t.Errorf("cost %v", st.CostUSD)
	}
}

func TestRequestIDWithControlCharactersIsReplaced(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"abc\r\nset-cookie: x=1", "has space", strings.Repeat("a", 200)} {
		s := h.open(t, modeBuffered, modeNone)
		s.send(postHeaders("/v1/chat/completions", keyAcme, "x-request-id", id))
		s.recv()
		s.send(reqBody([]byte(chatBody), true))
		r := s.recv()
		got := setHeaders(r.GetRequestBody().GetResponse().GetHeaderMutation())[contract.HeaderRequestID]
		if got == "" || got == id || strings.ContainsAny(got, "\r\n ") {
			t.Errorf("x-request-id %q forwarded as %q; want a fresh id", id, got)
		}
	}
	// A plain id is kept (and so not set again).
	s := h.open(t, modeBuffered, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme, "x-request-id", "req-123_abc"))
	s.recv()
	s.send(reqBody([]byte(chatBody), true))
	if got, ok := setHeaders(s.recv().GetRequestBody().GetResponse().GetHeaderMutation())[contract.HeaderRequestID]; ok {
		t.Errorf("a valid client id was replaced by %q", got)
	}
}

func TestTrailingSlashPathIsNotRouted(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeBuffered, modeNone)
	s.send(postHeaders("/v1/chat/completions/", keyAcme))
	if status, _ := immediateError(t, s.recv()); status != 404 {
		t.Errorf("status %d, want 404", status)
	}
}

func TestFullDuplexBodyShorterThanDeclared(t *testing.T) {
	h := newHarness(t)
	s := h.open(t, modeFullDuplex, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(chatBody)+100)))
	s.send(reqBody([]byte(chatBody), true))
	if status, _ := immediateError(t, s.recv()); status != 400 {
		t.Errorf("status %d, want 400", status)
	}
}

// Envoy reports the endpoint it really used (a retry may have moved the request): the settlement names it.
func TestSettlementUsesTheServedEndpoint(t *testing.T) {
	h := newHarness(t)
	s, r := post(t, h, keyAcme, chatBody, modeNone)
	chosen := lbDestination(r)
	if chosen == "" {
		t.Fatalf("no destination: %v", r)
	}
	m := respHeaders("200", false)
	m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		contract.MetadataNamespace: {Fields: map[string]*structpb.Value{contract.ServedEndpointKey: structpb.NewStringValue("10.9.9.9:8000")}},
	}}
	s.send(m)
	s.recv()
	if st := h.settlement(); st.Endpoint != "10.9.9.9:8000" {
		t.Errorf("settled against %q (chosen %q), want the endpoint Envoy served it on", st.Endpoint, chosen)
	}
}

// A declared content-length reserves nothing: memory follows the bytes that really arrive, so thousands of
// slow senders that declared large bodies hold nothing they have not sent.
func TestDeclaredLengthReservesNothing(t *testing.T) {
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{Policies: policies.NewStaticStore(snap)})
	rs := &requestState{srv: srv, ctx: context.Background()}
	m := postHeaders("/v1/chat/completions", keyAcme, "content-length", "1000000")
	m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modeFullDuplex}
	rs.handle(m)
	rs.handle(reqBody([]byte(`{"model":`), false))
	if c := cap(rs.body); c > 4096 {
		t.Errorf("%d bytes held for 9 received", c)
	}
	rs.close()
}

// GET /v1/models/{id} answers the model object for any name the tenant may use, and 404 otherwise.
func TestGetOneModel(t *testing.T) {
	h := newHarness(t)
	get := func(path, key string) (int, string) {
		s := h.open(t, modeBuffered, modeNone)
		s.send(reqHeaders(true, ":method", "GET", ":path", path, "authorization", "Bearer "+key))
		ir := s.recv().GetImmediateResponse()
		return int(ir.GetStatus().GetCode()), string(ir.GetBody())
	}
	if status, body := get("/v1/models/llama-70b", keyAcme); status != 200 || !strings.Contains(body, `"id":"llama-70b"`) || !strings.Contains(body, `"object":"model"`) {
		t.Errorf("alias: %d %s", status, body)
	}
	if status, _ := get("/v1/models/no-such-model", keyAcme); status != 404 {
		t.Errorf("unknown model: %d", status)
	}
	if status, _ := get("/v1/models/llama-70b", keyInitech); status != 404 {
		t.Errorf("a model the tenant may not call: %d, want 404", status)
	}
}

// Bodies not routed yet hold at most spec.gateway.maxBodyBytesInFlight across the process (large ones three
// quarters of it): one that does not fit is refused with 503 and retry-after as it arrives, a small body still
// fits where a large one does not, and the bytes come back when a request is routed or ends.
func TestBodyBudgetBoundsBodiesInFlight(t *testing.T) {
	text, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.Replace(string(text), "maxRequestBodyBytes: 1048576", "maxRequestBodyBytes: 1048576\n    maxBodyBytesInFlight: 1048576", 1)
	snap, err := policies.Parse("policy.yaml", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{Policies: policies.NewStaticStore(snap)})
	open := func(first []byte) (*requestState, []*extprocv3.ProcessingResponse) {
		rs := &requestState{srv: srv, ctx: context.Background()}
		m := postHeaders("/v1/chat/completions", keyAcme)
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modeFullDuplex}
		rs.handle(m)
		return rs, rs.handle(reqBody(first, false))
	}
	slow, _ := open([]byte(`{"model":"qwen2.5-7b","messages":[{"role":"user","content":"` + strings.Repeat("x", 600<<10)))
	if got := srv.bodies.held.Load(); got < 600<<10 {
		t.Fatalf("%d bytes held for a 600 KiB body in flight", got)
	}
	refused, out := open(make([]byte, 200<<10)) // 800 KiB would fit the budget, not the large bodies' 768 KiB
	if len(out) != 1 || out[0].GetImmediateResponse() == nil {
		t.Fatalf("a body past the budget was not refused: %v", out)
	}
	ir := out[0].GetImmediateResponse()
	if ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), "request_bodies_in_flight") ||
		!hasHeader(ir.GetHeaders(), "retry-after") {
		t.Errorf("refusal %d %s, want 503 request_bodies_in_flight with retry-after", ir.GetStatus().GetCode(), ir.GetBody())
	}
	refused.close()
	if small, out := open([]byte(`{"model":"qwen2.5-7b",`)); len(out) != 0 {
		t.Errorf("a small body was refused beside a large one: %v", out)
	} else {
		small.close()
	}
	slow.handle(reqBody([]byte(`"}]}`), true)) // the slow body completes and is routed
	slow.sent()
	if got := srv.bodies.held.Load(); got != 0 {
		t.Errorf("%d bytes still held once the request was routed", got)
	}
	slow.close()
	if next, out := open(make([]byte, 700<<10)); len(out) != 0 {
		t.Errorf("a body that fits again was answered %v", out)
	} else {
		next.close()
	}
	if got := srv.bodies.held.Load(); got != 0 {
		t.Errorf("%d bytes held after every stream ended", got)
	}
}

func hasHeader(m *extprocv3.HeaderMutation, name string) bool {
	for _, h := range m.GetSetHeaders() {
		if h.GetHeader().GetKey() == name {
			return true
		}
	}
	return false
}

// A large BUFFERED body is not read until the receive gate admits it: while another holds the gate its stream
// waits (the bytes stay in Envoy), and one that cannot be admitted before Envoy's message timeout is refused
// with 503 and retry-after; once the first is routed the next is admitted.
func TestLargeBodiesWaitAtTheReceiveGate(t *testing.T) {
	snap := gatePolicy(t)
	h := newHarnessWith(t, snap, config{})
	body := func(n int) []byte {
		return []byte(`{"model":"qwen2.5-7b","messages":[{"role":"user","content":"` + strings.Repeat("x", n-64) + `"}]}`)
	}
	large := body(900 << 10)
	start := func(b []byte) *stream {
		s := h.open(t, modeBuffered, modeNone)
		s.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(b))))
		if r := s.recv(); r.GetRequestHeaders() == nil {
			t.Fatalf("headers not answered: %v", r)
		}
		return s
	}
	first := start(large) // admitted: its stream is read on
	admitted(t, h)
	second := start(large) // waits at the gate, and cannot be admitted in time
	r := second.recv()
	ir := r.GetImmediateResponse()
	if ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), "request_bodies_in_flight") || !hasHeader(ir.GetHeaders(), "retry-after") {
		t.Fatalf("a large body past the gate: %v, want 503 request_bodies_in_flight with retry-after", r)
	}
	first.send(reqBody(large, true))
	if r := first.recv(); r.GetRequestBody() == nil {
		t.Fatalf("the admitted body was not routed: %v", r)
	}
	third := start(large) // the first was routed: room again
	third.send(reqBody(large, true))
	if r := third.recv(); r.GetRequestBody() == nil {
		t.Fatalf("a large body after the first was routed: %v", r)
	}
	// Ordinary bodies never wait at the gate.
	if _, r := post(t, h, keyAcme, chatBody, modeNone); r.GetRequestBody() == nil {
		t.Fatalf("an ordinary body was not routed: %v", r)
	}
	// A body that never comes (a client trickling it into Envoy) holds the gate a message timeout past the
	// longest wait, no longer: after that the next large body is admitted and routed.
	_ = start(large)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := start(large)
		s.send(reqBody(large, true))
		r := s.recv()
		if r.GetRequestBody() != nil {
			break
		}
		if r.GetImmediateResponse().GetStatus().GetCode() != 503 || time.Now().After(deadline) {
			t.Fatalf("behind a body that never came: %v", r)
		}
	}
}

// In FULL_DUPLEX_STREAMED mode a large body's chunks are not read until the gate admits it, with or without a
// declared length; one not admitted in a message timeout is refused with 503.
func TestLargeStreamedBodiesWaitAtTheReceiveGate(t *testing.T) {
	snap := gatePolicy(t)
	h := newHarnessWith(t, snap, config{})
	large := []byte(`{"model":"qwen2.5-7b","messages":[{"role":"user","content":"` + strings.Repeat("x", 900<<10) + `"}]}`)
	first := h.open(t, modeFullDuplex, modeNone)
	first.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(large))))
	first.send(reqBody(large[:100<<10], false)) // read once admitted
	admitted(t, h)
	// Without a declared length: admitted as the largest body once past 64 KiB, which the first leaves no room for.
	second := h.open(t, modeFullDuplex, modeNone)
	second.send(postHeaders("/v1/chat/completions", keyAcme))
	second.send(reqBody(large[:100<<10], false))
	r := second.recv()
	if ir := r.GetImmediateResponse(); ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), "request_bodies_in_flight") {
		t.Fatalf("a streamed body past the gate: %v, want 503 request_bodies_in_flight", r)
	}
	first.send(reqBody(large[100<<10:], true))
	if r := first.recv(); r.GetRequestHeaders() == nil {
		t.Fatalf("the admitted streamed body was not routed: %v", r)
	}
}

// A large body's frames and its scan give the network turns (netturn), so that ordinary requests' bytes are
// read while it is parsed; an ordinary body takes none.
func TestLargeBodiesGiveTheNetworkTurns(t *testing.T) {
	h := newHarnessWith(t, gatePolicy(t), config{})
	turns := func() int64 {
		polled, lapsed := netturn.Taken()
		return polled + lapsed
	}
	send := func(body []byte) int64 {
		before := turns()
		s := h.open(t, modeFullDuplex, modeNone)
		s.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(body))))
		for off := 0; off < len(body); off += 16 << 10 {
			end := min(off+16<<10, len(body))
			s.send(reqBody(body[off:end], end == len(body)))
		}
		if r := s.recv(); r.GetRequestHeaders() == nil {
			t.Fatalf("not routed: %v", r)
		}
		// Read the whole answer, so that the turns between its chunks are counted.
		for !s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
		}
		return turns() - before
	}
	text := func(n int) []byte {
		return []byte(`{"model":"qwen2.5-7b","messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`)
	}
	for _, size := range []int{2 << 10, 63 << 10} { // 63 KiB: answered in two chunks
		if n := send(text(size)); n != 0 {
			t.Errorf("a %d-byte body took %d turns, want none", size, n)
		}
	}
	if n := send(text(900 << 10)); n == 0 {
		t.Error("a 900 KiB body took no turn")
	}
}

// admitted waits until the receive gate has admitted a body, so that the next one finds it taken.
func admitted(t *testing.T, h *harness) {
	t.Helper()
	wait.For(t, "a body admitted at the receive gate", func() bool { return h.srv.receive.admitted.Load() > 0 })
}

// gatePolicy is the test policy with a receive gate that holds the largest body (1 MiB), a wait of 750 ms (a
// 1 s message timeout less its margin) and an admission lapse a second after that: room for a busy machine.
func gatePolicy(t *testing.T) *policies.Snapshot {
	t.Helper()
	text, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.Replace(string(text), "spec:\n", "spec:\n  admission: {bufferedMessageTimeout: 1s}\n", 1)
	policy = strings.Replace(policy, "maxRequestBodyBytes: 1048576", "maxRequestBodyBytes: 1048576\n    maxBodyBytesInFlight: 1572864", 1)
	snap, err := policies.Parse("policy.yaml", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}
