package extproc

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/test/wait"
)

// inFrames splits an encoding into buffers of at most frame bytes, as gRPC hands a received message over.
func inFrames(b []byte, frame int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), frame)
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func largeBody(n int) []byte { return bytes.Repeat([]byte(`{"a":1},`), n/8) }

// codecCases are encodings the codec must decode exactly as proto.Unmarshal does, with bodies of about n bytes.
func codecCases(t testing.TB, n int) map[string][]byte {
	body := largeBody(n)
	attrs := map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
		"request.path": structpb.NewStringValue("/v1/chat/completions")}}}
	reqBody := mustMarshal(t, &extprocv3.ProcessingRequest{
		Request:    &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}},
		Attributes: attrs, ObservabilityMode: true})
	respBody := mustMarshal(t, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: body}}})
	headers := mustMarshal(t, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-big", RawValue: body}}}}}})
	// The body field twice inside the body message: proto's last-one-wins, left to proto.Unmarshal.
	twice := protowire.AppendTag(nil, 1, protowire.BytesType)
	twice = protowire.AppendBytes(twice, []byte("first"))
	twice = protowire.AppendTag(twice, 1, protowire.BytesType)
	twice = protowire.AppendBytes(twice, body)
	bodyTwice := protowire.AppendTag(nil, 4, protowire.BytesType)
	bodyTwice = protowire.AppendBytes(bodyTwice, twice)
	// Headers after the body: the oneof's last member wins.
	headersAfter := append(append([]byte{}, reqBody...), mustMarshal(t, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}})...)
	// A field this version does not know, after the body.
	unknown := protowire.AppendTag(append([]byte{}, reqBody...), 999, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, []byte("future"))
	return map[string][]byte{
		"request body":      reqBody,
		"response body":     respBody,
		"large headers":     headers,
		"body field twice":  bodyTwice,
		"headers after":     headersAfter,
		"unknown field":     unknown,
		"truncated":         reqBody[:len(reqBody)-7],
		"bad tag":           append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, reqBody...),
		"empty":             nil,
		"body not a string": protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 3),
	}
}

// decodeBoth decodes b with the codec's path for large bodies and with proto.Unmarshal, and fails the test
// unless they agree.
func decodeBoth(t testing.TB, b []byte, frame int) *extprocv3.ProcessingRequest {
	t.Helper()
	var called int
	fast := &extprocv3.ProcessingRequest{}
	_, fastErr := unmarshalRequest(gather(make([]byte, 0, len(b)), inFrames(b, frame), func() { called++ }), fast)
	want := &extprocv3.ProcessingRequest{}
	wantErr := proto.Unmarshal(b, want)
	if (fastErr == nil) != (wantErr == nil) {
		t.Fatalf("codec error %v, proto.Unmarshal's %v", fastErr, wantErr)
	}
	if wantErr == nil && !proto.Equal(fast, want) {
		t.Fatalf("the codec decoded a different message than proto.Unmarshal")
	}
	if got, want := called, len(b)/gatherSliceBytes; got != want {
		t.Fatalf("gathering %d bytes gave way %d times, want %d", len(b), got, want)
	}
	return fast
}

func TestBodyCodecDecodesAsProtoDoes(t *testing.T) {
	for name, b := range codecCases(t, 3*largeBodyBytes) {
		t.Run(name, func(t *testing.T) {
			for _, frame := range []int{1 << 14, 1000, len(b) + 1} {
				decodeBoth(t, b, frame)
			}
		})
	}
}

// The body of a large message is not copied out of the gathered buffer, and appending to it cannot write into
// what follows it there.
func TestBodyCodecAliasesTheBody(t *testing.T) {
	b := codecCases(t, 3*largeBodyBytes)["unknown field"]
	buf := gather(nil, inFrames(b, 1<<14), func() {})
	req := &extprocv3.ProcessingRequest{}
	if aliased, err := unmarshalRequest(buf, req); err != nil || !aliased {
		t.Fatalf("aliased %v, error %v", aliased, err)
	}
	body := req.GetRequestBody().GetBody()
	at := bytes.Index(buf, body)
	if at < 0 || &buf[at] != &body[0] {
		t.Fatalf("the body is a copy, not the gathered buffer's bytes")
	}
	if cap(body) != len(body) {
		t.Fatalf("the body's capacity %d reaches past its length %d into the buffer", cap(body), len(body))
	}
}

// The codec the server installs takes the large-body path only for large ProcessingRequests; anything else
// goes to grpc-go's codec, whose results it must match.
func TestBodyCodecRoutesByMessageAndSize(t *testing.T) {
	c := newBodyCodec()
	if c.Name() != "proto" {
		t.Fatalf("codec name %q: clients ask for proto", c.Name())
	}
	small := mustMarshal(t, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{}`)}}})
	for name, b := range map[string][]byte{"small": small, "large": codecCases(t, 3*largeBodyBytes)["request body"]} {
		got := &extprocv3.ProcessingRequest{}
		if err := c.Unmarshal(inFrames(b, 1<<14), got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := &extprocv3.ProcessingRequest{}
		if err := proto.Unmarshal(b, want); err != nil || !proto.Equal(got, want) {
			t.Fatalf("%s: decoded differently from proto.Unmarshal (%v)", name, err)
		}
	}
	other := &extprocv3.HttpBody{}
	if err := c.Unmarshal(inFrames(mustMarshal(t, &extprocv3.HttpBody{Body: largeBody(largeBodyBytes * 2)}), 1<<14),
		other); err != nil || len(other.Body) != largeBodyBytes*2 {
		t.Fatalf("another message type: %v, %d bytes", err, len(other.Body))
	}
}

// FuzzBodyCodec feeds the large-body decoder arbitrary encodings in arbitrary frames: it must agree with
// proto.Unmarshal on every one.
func FuzzBodyCodec(f *testing.F) {
	for _, b := range codecCases(f, 200) {
		f.Add(b, uint16(100))
	}
	small := mustMarshal(f, &extprocv3.ProcessingRequest{
		Request:           &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m"}`), EndOfStream: true}},
		ObservabilityMode: true})
	f.Add(small, uint16(3))
	f.Fuzz(func(t *testing.T, b []byte, frame uint16) {
		decodeBoth(t, b, int(frame)+1)
	})
}

// bodyResponses are answers that carry a whole body, as decideBuffered and the response path build them.
func bodyResponses(body []byte) map[string]*extprocv3.ProcessingResponse {
	meta, _ := structpb.NewStruct(map[string]any{"b": "2", "a": "1", "c": map[string]any{"z": 1.0, "y": true}})
	common := func() *extprocv3.CommonResponse {
		return &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte("12")}}},
				RemoveHeaders: []string{"x-infergate-pool"}},
			BodyMutation:    &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}},
			ClearRouteCache: true,
		}
	}
	return map[string]*extprocv3.ProcessingResponse{
		"request body": {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: common()}}, DynamicMetadata: meta},
		"response body": {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_Body{Body: body}}}}}},
	}
}

// A response handed over with its body's buffer encodes to the response, with the body sent from that buffer;
// the response itself is left as it was.
func TestBodyCodecSendsTheBodyFromItsBuffer(t *testing.T) {
	c := newBodyCodec()
	for name, resp := range bodyResponses(largeBody(largeBodyBytes * 2)) {
		t.Run(name, func(t *testing.T) {
			body := resp.GetRequestBody().GetResponse().GetBodyMutation().GetBody()
			if body == nil {
				body = resp.GetResponseBody().GetResponse().GetBodyMutation().GetBody()
			}
			before := proto.Clone(resp)
			freed := 0
			buf := &body
			got, err := c.Marshal(handedOverBody{resp: resp, body: mem.NewBuffer(buf, countingPool{&freed})})
			if err != nil {
				t.Fatal(err)
			}
			sameMessage(t, got.Materialize(), resp)
			if len(got) != 3 || &got[1].ReadOnlyData()[0] != &body[0] {
				t.Fatal("the body was copied, not sent from its buffer")
			}
			if !proto.Equal(resp, before) {
				t.Fatal("marshalling changed the response")
			}
			got.Free()
			if freed != 1 {
				t.Fatalf("the body's buffer freed %d times once sent, want 1", freed)
			}
		})
	}
}

// A response whose body is not the handed-over buffer is encoded by copying, and the buffer is still freed.
func TestBodyCodecCopiesWhatIsNotItsBuffer(t *testing.T) {
	c := newBodyCodec()
	body := largeBody(largeBodyBytes * 2)
	other := bytes.Clone(body)
	for name, resp := range map[string]*extprocv3.ProcessingResponse{
		"another buffer": bodyResponses(other)["request body"],
		"headers":        {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		"no mutation":    {Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}},
		"empty":          {},
	} {
		freed := 0
		got, err := c.Marshal(handedOverBody{resp: resp, body: mem.NewBuffer(&body, countingPool{&freed})})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sameMessage(t, got.Materialize(), resp)
		if freed != 1 {
			t.Errorf("%s: the handed-over buffer freed %d times, want 1", name, freed)
		}
	}
}

// sameMessage fails the test unless enc, an encoding in parts, decodes to want and is as long as
// proto.Marshal's encoding of it (proto.Marshal orders fields its own way; a decoder takes any order).
func sameMessage(t *testing.T, enc []byte, want *extprocv3.ProcessingResponse) {
	t.Helper()
	got := &extprocv3.ProcessingResponse{}
	if err := proto.Unmarshal(enc, got); err != nil || !proto.Equal(got, want) {
		t.Fatalf("the encoding decodes to another message (%v)", err)
	}
	if n := proto.Size(want); len(enc) != n {
		t.Fatalf("the encoding is %d bytes, proto.Marshal's %d", len(enc), n)
	}
}

type countingPool struct{ n *int }

func (p countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p countingPool) Put(*[]byte)       { *p.n++ }

// Large BUFFERED bodies renamed by several streams at once come back each with its own bytes: a buffer handed
// to gRPC is reused only once written.
func TestLargeRewrittenBodiesSurviveTheirBuffersReuse(t *testing.T) {
	h := newHarness(t)
	const streams, rounds = 8, 3
	for round := range rounds {
		var open [streams]*stream
		var sent [streams]string
		for i := range open {
			content := strings.Repeat(string(rune('a'+i)), 700<<10+round*1000+i)
			sent[i] = `{"model":"llama-70b","max_tokens":7,"messages":[{"role":"user","content":"` + content + `"}]}`
			open[i] = h.open(t, modeBuffered, modeNone)
			open[i].send(postHeaders("/v1/chat/completions", keyAcme))
			open[i].recv()
		}
		for i, s := range open {
			s.send(reqBody([]byte(sent[i]), true))
		}
		for i, s := range open {
			got := s.recv().GetRequestBody().GetResponse().GetBodyMutation().GetBody()
			want := strings.Replace(sent[i], `"llama-70b"`, `"meta-llama/Llama-3.3-70B-Instruct"`, 1)
			if string(got) != want {
				t.Fatalf("round %d, stream %d: %d bytes back, not its own renamed body of %d", round, i, len(got), len(want))
			}
		}
	}
}

// Received through pooledRequest, a large request body is handed over in its pool buffer; a large response body
// is copied out of it (the response path keeps bodies by rules of its own) and a small message never uses one.
// The copies of a large message give way every gatherSliceBytes: once gathering, again copying a response body.
func TestPooledRequestHandsOverOnlyRequestBodies(t *testing.T) {
	yields := 0
	c := newBodyCodec()
	c.yield = func() { yields++ }
	cases := codecCases(t, 3*gatherSliceBytes)
	for _, tc := range []struct {
		name   string
		handed bool
		copies int
	}{
		{"request body", true, 1}, {"response body", false, 2}, {"large headers", false, 1}, {"body field twice", false, 1},
	} {
		yields = 0
		var in pooledRequest
		if err := c.Unmarshal(inFrames(cases[tc.name], 1<<14), &in); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (in.buf != nil) != tc.handed {
			t.Fatalf("%s: buffer handed over: %v, want %v", tc.name, in.buf != nil, tc.handed)
		}
		ref := &extprocv3.ProcessingRequest{}
		if err := proto.Unmarshal(cases[tc.name], ref); err != nil || !proto.Equal(in.req, ref) {
			t.Fatalf("%s: decoded differently from proto.Unmarshal (%v)", tc.name, err)
		}
		if want := tc.copies * 3; yields < want {
			t.Errorf("%s: %d yields, want at least %d", tc.name, yields, want)
		}
		if in.buf == nil {
			continue
		}
		body := in.req.GetRequestBody().GetBody()
		if at := bytes.Index(*in.buf, body); at < 0 || &(*in.buf)[at] != &body[0] {
			t.Fatalf("%s: the body is not in the handed-over buffer", tc.name)
		}
		sharedBufferPool.Put(in.buf)
	}
	small := mustMarshal(t, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{}`)}}})
	var in pooledRequest
	if err := c.Unmarshal(inFrames(small, 1<<14), &in); err != nil || in.buf != nil || string(in.req.GetRequestBody().GetBody()) != `{}` {
		t.Fatalf("a small message: %v, buffer %v, %v", err, in.buf != nil, in.req)
	}
}

// lendingPool is a BufferPool that knows which body-sized buffers (over largeBodyBytes) it has lent: one put
// back that is not out (twice, or never lent) is recorded. gRPC's own frame buffers are smaller, and a stream
// reset may leave them to the collector, so they are not counted.
type lendingPool struct {
	inner BufferPool
	mu    sync.Mutex
	out   map[*[]byte]bool
	bad   int
}

func (p *lendingPool) Get(n int) *[]byte {
	b := p.inner.Get(n)
	if n > largeBodyBytes {
		p.mu.Lock()
		p.out[b] = true
		p.mu.Unlock()
	}
	return b
}

func (p *lendingPool) Put(b *[]byte) {
	if cap(*b) > largeBodyBytes {
		p.mu.Lock()
		if !p.out[b] {
			p.bad++
		}
		delete(p.out, b)
		p.mu.Unlock()
	}
	p.inner.Put(b)
}

// outstanding lists the capacities of the buffers out.
func (p *lendingPool) outstanding() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var caps []int
	for b := range p.out {
		caps = append(caps, cap(*b))
	}
	return caps
}

func (p *lendingPool) state() (out, bad int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out), p.bad
}

// Every body-sized buffer the shared pool lends — a BUFFERED body kept as the request's, a rewritten body handed
// to gRPC, a body gathered from frames — comes back once, whether the request is routed, refused,
// answered in frames, given a large response or cancelled before its answer is read.
func TestEveryLentBufferComesBackOnce(t *testing.T) {
	pool := &lendingPool{out: map[*[]byte]bool{}}
	saved := sharedBufferPool
	sharedBufferPool = pool
	t.Cleanup(func() { sharedBufferPool = saved })
	h := newHarness(t)
	chat := func(n int) string {
		return `{"model":"llama-70b","max_tokens":7,"messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`
	}
	// Routed and renamed, then a large whole response.
	s, r := post(t, h, keyAcme, chat(300<<10), modeBuffered)
	if r.GetRequestBody().GetResponse().GetBodyMutation().GetBody() == nil {
		t.Fatalf("not rewritten: %v", r)
	}
	s.send(respHeaders("200", false, "content-type", "application/json"))
	s.recv()
	s.send(respBody([]byte(`{"id":"c","object":"chat.completion","model":"x","choices":[{"message":{"content":"`+
		strings.Repeat("y", 200<<10)+`"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`), true))
	s.recv()
	// Refused: a large body that does not parse.
	if _, r := post(t, h, keyAcme, chat(300 << 10)[:200<<10], modeNone); r.GetImmediateResponse() == nil {
		t.Fatalf("a truncated body was not refused: %v", r)
	}
	// Refused as too large before it is kept (the policy's limit is 1 MiB).
	if _, r := post(t, h, keyAcme, chat(1100<<10), modeNone); r.GetImmediateResponse() == nil {
		t.Fatalf("a body over the limit was not refused: %v", r)
	}
	// In one FULL_DUPLEX_STREAMED frame, which is copied into the request's own buffer.
	one := h.open(t, modeFullDuplex, modeNone)
	one.send(postHeaders("/v1/chat/completions", keyAcme))
	one.send(reqBody([]byte(chat(200<<10)), true))
	if got := one.recv(); got.GetRequestHeaders() == nil {
		t.Fatalf("not routed: %v", got)
	}
	// In frames.
	body := chat(300 << 10)
	fd := h.open(t, modeFullDuplex, modeNone)
	fd.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(body))))
	for off := 0; off < len(body); off += 16 << 10 {
		end := min(off+16<<10, len(body))
		fd.send(reqBody([]byte(body[off:end]), end == len(body)))
	}
	if got := fd.recv(); got.GetRequestHeaders() == nil {
		t.Fatalf("not routed: %v", got)
	}
	if got := fd.recvStreamed(true, 64); len(got) < len(body) {
		t.Fatalf("%d bytes of a %d-byte body came back", len(got), len(body))
	}
	// Cancelled with its body sent and its answer unread.
	c := h.open(t, modeBuffered, modeNone)
	c.send(postHeaders("/v1/chat/completions", keyAcme))
	c.recv()
	c.send(reqBody([]byte(chat(300<<10)), true))
	c.cancel()
	s.cancel()
	fd.cancel()
	one.cancel()
	if !wait.Until(10*time.Second, func() bool { out, _ := pool.state(); return out == 0 }) {
		t.Fatalf("buffers still out: %v", pool.outstanding())
	}
	if _, bad := pool.state(); bad != 0 {
		t.Fatalf("%d buffers came back that were not out", bad)
	}
}
