package envoysim

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// filterCfg renders the ext_proc filter fields at the template's indentation.
func filterCfg(lines ...string) string {
	var b strings.Builder
	timeout := false
	for _, l := range lines {
		b.WriteString("              " + l + "\n")
		timeout = timeout || strings.HasPrefix(l, "message_timeout")
	}
	if !timeout {
		// Envoy's default is 200 ms; a scripted processor on a loaded CI machine with the race detector can be
		// slower than that, and these tests are not about the timeout (the timeout tests set their own).
		b.WriteString("              message_timeout: 5s\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

const lbMeta = "metadata_options: {receiving_namespaces: {untyped: [envoy.lb]}}"

func TestShippedEnvoyConfigsLoad(t *testing.T) {
	for _, f := range []string{"../../deploy/envoy/envoy.yaml", "../../deploy/envoy/envoy-buffered.yaml"} {
		cfg, err := LoadFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if cfg.ExtProc == nil || cfg.ExtProcAddr != "127.0.0.1:9002" || len(cfg.Clusters) < 4 {
			t.Errorf("%s: ext_proc %v at %q, %d clusters", f, cfg.ExtProc != nil, cfg.ExtProcAddr, len(cfg.Clusters))
		}
		for name, c := range cfg.Clusters {
			if strings.HasPrefix(name, "pool/") && c.OverrideHost == nil {
				t.Errorf("%s: cluster %s lacks the override_host policy", f, name)
			}
		}
		if got := cfg.ExtProc.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(); len(got) != 1 || got[0] != "envoy.lb" {
			t.Errorf("%s: receiving_namespaces = %v", f, got)
		}
	}
}

// E1: no stream is opened when every phase is SKIP/NONE.
func TestNoStreamWhenNothingIsSent(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SKIP}"), 1<<20, nil)
	if r := s.do("GET", "/x", ""); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if s.proc.streams != 0 {
		t.Errorf("%d streams opened", s.proc.streams)
	}
}

// E1, E3: headers arrive lower-case in raw_value, protocol_config only on the first message,
// end_of_stream on a headers-only request; one answer per message.
func TestHeadersMessageShape(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SEND}"), 1<<20,
		func(t *testing.T, p *procStream) { passThrough(p) })
	if r := s.do("GET", "/v1/models?x=1", "", "X-Custom", "Value"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	p := s.stream()
	if len(p.seen) != 2 || p.seen[0].GetRequestHeaders() == nil || p.seen[1].GetResponseHeaders() == nil {
		t.Fatalf("messages: %v", p.seen)
	}
	first := p.seen[0]
	if first.GetProtocolConfig() == nil || p.seen[1].GetProtocolConfig() != nil {
		t.Error("protocol_config must be on the first message only")
	}
	if !first.GetRequestHeaders().GetEndOfStream() {
		t.Error("a GET without body must have end_of_stream on its headers")
	}
	for _, h := range first.GetRequestHeaders().GetHeaders().GetHeaders() {
		if h.GetKey() != strings.ToLower(h.GetKey()) || h.GetValue() != "" || len(h.GetRawValue()) == 0 {
			t.Errorf("header %q must be lower-case with raw_value only", h.GetKey())
		}
	}
	if v, _ := headerOf(first, ":path"); v != "/v1/models?x=1" {
		t.Errorf(":path = %q", v)
	}
	if v, _ := headerOf(first, "x-custom"); v != "Value" {
		t.Errorf("x-custom = %q", v)
	}
	if v, _ := headerOf(p.seen[1], ":status"); v != "200" {
		t.Errorf(":status = %q", v)
	}
}

// E2 BUFFERED: the body is held while the headers answer is pending, then sent whole in one message;
// E4 header mutations in the body answer apply; E5 content-length must match the mutated body.
func TestBufferedBodyMutationAndContentLength(t *testing.T) {
	for _, fixLength := range []bool{true, false} {
		t.Run(fmt.Sprint("fix content-length ", fixLength), func(t *testing.T) {
			s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, response_header_mode: SKIP}", "status_on_error: {code: 502}"), 1<<20,
				func(t *testing.T, p *procStream) {
					p.next()
					// Hold the headers answer: the body must not arrive meanwhile (E2). Listen for 50 ms.
					next := make(chan *extprocv3.ProcessingRequest, 1)
					go func() { next <- p.next() }()
					select {
					case m := <-next:
						t.Errorf("%T arrived while the headers answer was held", m.GetRequest())
						next <- m
					case <-time.After(50 * time.Millisecond):
					}
					p.reply(reqHeadersResp(nil))
					m := <-next
					if m.GetRequestBody() == nil || !m.GetRequestBody().GetEndOfStream() || string(m.GetRequestBody().GetBody()) != `{"model":"a","x":1}` {
						t.Errorf("want the whole body in one end_of_stream message, got %v", m)
					}
					newBody := `{"model":"rewritten-longer","x":1}`
					hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-added", "yes")}}
					if fixLength {
						hm.SetHeaders = append(hm.SetHeaders, set("content-length", fmt.Sprint(len(newBody))))
					}
					p.reply(reqBodyResp(&extprocv3.CommonResponse{HeaderMutation: hm,
						BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(newBody)}}}))
				})
			r := s.do("POST", "/x", `{"model":"a","x":1}`)
			if !fixLength {
				if r.status != 502 {
					t.Fatalf("content-length mismatch must fail with status_on_error, got %d", r.status)
				}
				return
			}
			if r.status != 200 {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			got := s.a1.lastOrOther(t, s.a2)
			if got.Body != `{"model":"rewritten-longer","x":1}` || got.Headers.Get("x-added") != "yes" {
				t.Errorf("upstream got %q %v", got.Body, got.Headers)
			}
		})
	}
}

func (u *upstream) lastOrOther(t *testing.T, other *upstream) seenRequest {
	t.Helper()
	if u.count() > 0 {
		return u.last(t)
	}
	return other.last(t)
}

// E2: BUFFERED over the buffer limit is a 413 from Envoy; BUFFERED_PARTIAL sends what fits with
// end_of_stream=false and passes the rest through, never 413.
func TestBufferLimit(t *testing.T) {
	big := strings.Repeat("x", 3000)
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, request_body_mode: BUFFERED, response_header_mode: SKIP}"), 1024,
		func(t *testing.T, p *procStream) { passThrough(p) })
	if r := s.do("POST", "/x", big); r.status != 413 {
		t.Errorf("BUFFERED over the limit: %d", r.status)
	}

	s = newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, request_body_mode: BUFFERED_PARTIAL, response_header_mode: SKIP}"), 1024,
		func(t *testing.T, p *procStream) {
			m := p.next()
			if len(m.GetRequestBody().GetBody()) != 1024 || m.GetRequestBody().GetEndOfStream() {
				t.Errorf("partial message: %d bytes, end_of_stream %v", len(m.GetRequestBody().GetBody()), m.GetRequestBody().GetEndOfStream())
			}
			p.reply(reqBodyResp(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("HEAD")}}}))
			passThrough(p)
		})
	if r := s.do("POST", "/x", big); r.status != 200 {
		t.Fatalf("BUFFERED_PARTIAL: %d", r.status)
	}
	if got := s.a1.lastOrOther(t, s.a2).Body; got != "HEAD"+big[1024:] {
		t.Errorf("upstream body %d bytes, want mutated head + unprocessed rest", len(got))
	}
	if s.proc.streams != 1 {
		t.Errorf("streams %d", s.proc.streams)
	}
}

// slowBody yields chunks with pauses, so frames reach the filter separately.
type slowBody struct {
	chunks []string
	i      int
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.i >= len(b.chunks) {
		return 0, io.EOF
	}
	if b.i > 0 {
		time.Sleep(30 * time.Millisecond)
	}
	n := copy(p, b.chunks[b.i])
	b.i++
	return n, nil
}

func (s *setup) doChunked(path string, chunks []string, hdr ...string) result {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.url+path, &slowBody{chunks: chunks})
	req.ContentLength = -1
	return s.send(req, hdr...)
}

// E2 STREAMED: chunks are pipelined (the next is sent before the previous is answered), answers apply
// to the oldest chunk in order, and header mutations in body answers are ignored (E4).
func TestStreamedPipelining(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: STREAMED, response_header_mode: SKIP}"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(nil))
			first, second := p.next(), p.next() // both arrive before any body answer
			if string(first.GetRequestBody().GetBody()) != "one," || string(second.GetRequestBody().GetBody()) != "two," {
				t.Errorf("chunks %q %q", first.GetRequestBody().GetBody(), second.GetRequestBody().GetBody())
			}
			p.reply(reqBodyResp(&extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-late", "1")}},
				BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("ONE,")}}}))
			p.reply(reqBodyResp(nil))
			passThrough(p)
		})
	r := s.doChunked("/x", []string{"one,", "two,", "three"})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	got := s.a1.lastOrOther(t, s.a2)
	if got.Body != "ONE,two,three" {
		t.Errorf("upstream body %q", got.Body)
	}
	if got.Headers.Get("x-late") != "" {
		t.Error("a header mutation in a STREAMED body answer was applied")
	}
	if got.Headers.Get("content-length") != "" {
		t.Error("content-length must be removed in STREAMED mode")
	}
}

// E2 FULL_DUPLEX_STREAMED: the headers answer may come after the body; the server returns any number of
// streamed_response chunks; routing decided then (clear_route_cache with the header mutation) holds.
func TestFullDuplexDeferredHeaders(t *testing.T) {
	s := newSetup(t, filterCfg(
		"processing_mode: {request_header_mode: SEND, request_body_mode: FULL_DUPLEX_STREAMED, request_trailer_mode: SEND, response_header_mode: SKIP}",
		lbMeta), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			var body []byte
			for {
				m := p.next()
				body = append(body, m.GetRequestBody().GetBody()...)
				if m.GetRequestBody().GetEndOfStream() {
					break
				}
			}
			p.reply(&extprocv3.ProcessingResponse{
				Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
					ClearRouteCache: true,
					HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-route", "b")}},
				}}}})
			// Decoupled chunk counts: three chunks in, two out.
			p.reply(streamed(true, strings.ToUpper(string(body[:3])), false))
			p.reply(streamed(true, string(body[3:]), true))
			passThrough(p)
		})
	r := s.doChunked("/x", []string{"abc", "def", "ghi"})
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if got := s.b.last(t); got.Body != "ABCdefghi" {
		t.Errorf("cluster b got %q", got.Body)
	}
}

// E2: a non-streamed body mutation in FULL_DUPLEX_STREAMED is spurious; failure_mode_allow is forced off
// once body was sent, so the request fails with status_on_error.
func TestFullDuplexSpuriousIsFailClosed(t *testing.T) {
	s := newSetup(t, filterCfg(
		"processing_mode: {request_header_mode: SEND, request_body_mode: FULL_DUPLEX_STREAMED, request_trailer_mode: SEND, response_header_mode: SKIP}",
		"failure_mode_allow: true"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			for !p.next().GetRequestBody().GetEndOfStream() {
			}
			p.reply(reqHeadersResp(nil))
			p.reply(reqBodyResp(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("x")}}}))
			time.Sleep(100 * time.Millisecond)
		})
	if r := s.do("POST", "/x", "body"); r.status != 500 {
		t.Errorf("status %d, want 500 (fail-closed after body in FULL_DUPLEX_STREAMED)", r.status)
	}
}

// E3: trailers are sent when the mode is SEND and the request has them; the last body message then
// has end_of_stream=false.
func TestRequestTrailers(t *testing.T) {
	s := newSetup(t, filterCfg(
		"processing_mode: {request_header_mode: SEND, request_body_mode: FULL_DUPLEX_STREAMED, request_trailer_mode: SEND, response_header_mode: SKIP}"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			var last *extprocv3.ProcessingRequest
			for {
				m := p.next()
				if m.GetRequestTrailers() != nil {
					if last == nil || last.GetRequestBody().GetEndOfStream() {
						t.Error("body before trailers must not carry end_of_stream")
					}
					if len(m.GetRequestTrailers().GetTrailers().GetHeaders()) == 0 {
						t.Error("trailers message without trailers")
					}
					break
				}
				last = m
			}
			p.reply(reqHeadersResp(nil))
			p.reply(streamed(true, "payload", true))
			p.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
			passThrough(p)
		})
	req, _ := http.NewRequest("POST", s.url+"/x", &slowBody{chunks: []string{"pay", "load"}})
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Checksum": {"abc"}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// E4: the mutation checker.
func TestHeaderMutationRules(t *testing.T) {
	mutate := func(hm *extprocv3.HeaderMutation) script {
		return func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(&extprocv3.CommonResponse{HeaderMutation: hm}))
			passThrough(p)
		}
	}
	valueOnly := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-value-only", Value: "lost"}}
	//lint:ignore SA1019 the deprecated BoolValue append is the one Envoy's ext_proc reads (E4)
	appendOpt := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-multi", RawValue: []byte("second")}, Append: wrapperspb.Bool(true)}
	hm := &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{valueOnly, appendOpt, set("x-over", "new"), set("x-envoy-internal", "1"),
			set(":authority", "evil.example"), set(":path", "/rewritten")},
		RemoveHeaders: []string{"host", ":method", "x-remove-me"},
	}
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}"), 1<<20, mutate(hm))
	r := s.do("GET", "/orig", "", "X-Multi", "first", "X-Over", "old", "X-Remove-Me", "1", "Host", "good.example")
	if r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	got := s.a1.lastOrOther(t, s.a2)
	checks := []struct {
		name string
		ok   bool
	}{
		{"value without raw_value is an empty header", got.Headers.Get("x-value-only") == "" && len(got.Headers.Values("X-Value-Only")) == 1},
		{"append adds a value", strings.Join(got.Headers.Values("X-Multi"), ",") == "first,second"},
		{"default overwrites", got.Headers.Get("x-over") == "new"},
		{"x-envoy-* denied without allow_envoy", got.Headers.Get("x-envoy-internal") == ""},
		{":authority denied without allow_all_routing", got.Host == "good.example"},
		{"removal of host ignored", got.Host != ""},
		{"plain removal applied", got.Headers.Get("x-remove-me") == ""},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("%s (upstream headers %v host %q)", c.name, got.Headers, got.Host)
		}
	}
	if s.a1.count()+s.a2.count() == 0 {
		t.Fatal("no upstream request")
	}

	// disallow_is_error turns a denied mutation into status_on_error.
	s = newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}",
		"mutation_rules: {disallow_is_error: true}"), 1<<20,
		mutate(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-envoy-x", "1")}}))
	if r := s.do("GET", "/x", ""); r.status != 500 {
		t.Errorf("disallow_is_error: status %d", r.status)
	}
	// allow_all_routing and allow_envoy open those headers.
	s = newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}",
		"mutation_rules: {allow_all_routing: true, allow_envoy: true}"), 1<<20,
		mutate(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-envoy-x", "1"), set(":authority", "new.example")}}))
	s.do("GET", "/x", "")
	if got := s.a1.lastOrOther(t, s.a2); got.Host != "new.example" || got.Headers.Get("x-envoy-x") != "1" {
		t.Errorf("allowed mutations not applied: host %q headers %v", got.Host, got.Headers)
	}
}

// E6: clear_route_cache is honoured only with a header mutation in the same response.
func TestClearRouteCache(t *testing.T) {
	tests := []struct {
		name   string
		script script
		wantB  bool
	}{
		{"mutation and clear in one response", func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(&extprocv3.CommonResponse{ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-route", "b")}}}))
			passThrough(p)
		}, true},
		{"mutation without clear keeps the route", func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(&extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-route", "b")}}}))
			passThrough(p)
		}, false},
		{"clear in a response without mutation is ignored", func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(&extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-route", "b")}}}))
			m := p.next()
			_ = m
			p.reply(reqBodyResp(&extprocv3.CommonResponse{ClearRouteCache: true}))
			passThrough(p)
		}, false},
		{"clear with mutation in the BUFFERED body answer", func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(nil))
			p.next()
			p.reply(reqBodyResp(&extprocv3.CommonResponse{ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-route", "b")}}}))
			passThrough(p)
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, response_header_mode: SKIP}"), 1<<20, tc.script)
			if r := s.do("POST", "/x", "body"); r.status != 200 {
				t.Fatalf("status %d", r.status)
			}
			if (s.b.count() == 1) != tc.wantB {
				t.Errorf("routed to b: %v, want %v", s.b.count() == 1, tc.wantB)
			}
		})
	}
}

// E7: dynamic metadata is kept only for receiving_namespaces; override_host reads the destination from
// it (or the header), skips addresses not in the cluster, retries the next listed one on connect failure, and
// falls back to its LB policy.
func TestOverrideHostAndMetadata(t *testing.T) {
	answer := func(dest string, viaHeader bool) script {
		return func(t *testing.T, p *procStream) {
			p.next()
			cr := &extprocv3.CommonResponse{}
			resp := reqHeadersResp(cr)
			if viaHeader {
				cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-gateway-destination-endpoint", dest)}}
			} else {
				resp.DynamicMetadata = lbMetadata(dest)
			}
			p.reply(resp)
			passThrough(p)
		}
	}
	t.Run("metadata names the host", func(t *testing.T) {
		s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}", lbMeta), 1<<20, nil)
		s.proc.script = answer(s.a2.addr, false)
		for range 3 {
			s.do("GET", "/x", "")
		}
		if s.a2.count() != 3 || s.a1.count() != 0 {
			t.Errorf("a1=%d a2=%d, want all on a2", s.a1.count(), s.a2.count())
		}
	})
	t.Run("metadata dropped without receiving_namespaces", func(t *testing.T) {
		s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}"), 1<<20, nil)
		s.proc.script = answer(s.a2.addr, false)
		// The fallback balances over a1 and a2 at random: 24 requests all landing on a2 by chance is 2^-24.
		for range 24 {
			s.do("GET", "/x", "")
		}
		if s.a1.count() == 0 {
			t.Error("without receiving_namespaces the metadata must be ignored and the fallback LB used")
		}
	})
	t.Run("non-members skipped, connect failure retried on the next listed host", func(t *testing.T) {
		s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}", lbMeta), 1<<20, nil)
		s.proc.script = answer("192.0.2.1:80,"+s.dead+","+s.a1.addr, true)
		if r := s.do("GET", "/x", ""); r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		if s.a1.count() != 1 {
			t.Errorf("a1=%d a2=%d: want the third listed (first reachable member)", s.a1.count(), s.a2.count())
		}
	})
}

// E8: immediate_response: the status (< 200 becomes 200), headers and body reach the client; nothing goes upstream.
func TestImmediateResponse(t *testing.T) {
	for _, tc := range []struct{ code, want int }{{429, 429}, {100, 200}, {0, 200}} {
		s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}"), 1<<20,
			func(t *testing.T, p *procStream) {
				p.next()
				p.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
					Status:  &typev3.HttpStatus{Code: typev3.StatusCode(tc.code)},
					Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("retry-after", "3"), set("content-type", "application/json")}},
					Body:    []byte(`{"error":{"message":"slow down"}}`), Details: "rate_limited",
				}}})
			})
		r := s.do("GET", "/x", "")
		if r.status != tc.want || r.header.Get("retry-after") != "3" || !strings.Contains(r.body, "slow down") || r.details != "rate_limited" {
			t.Errorf("code %d: got %d %v %q", tc.code, r.status, r.header, r.body)
		}
		if s.a1.count()+s.a2.count()+s.b.count() != 0 {
			t.Error("an immediate response must not reach the upstream")
		}
	}
}

// E9: message timeout → 504 (bypass with failure_mode_allow); gRPC error → status_on_error (bypass
// with failure_mode_allow); a server OK-close means continue unprocessed.
func TestFailureModes(t *testing.T) {
	slow := func(t *testing.T, p *procStream) { p.next(); time.Sleep(300 * time.Millisecond) }
	grpcErr := func(t *testing.T, p *procStream) { p.next(); p.fail(status.Error(codes.Unavailable, "down")) }
	okClose := func(t *testing.T, p *procStream) { p.next() }
	tests := []struct {
		name    string
		cfg     []string
		script  script
		status  int
		details string
	}{
		{"timeout fails closed with 504", []string{"message_timeout: 0.1s"}, slow, 504, "ext_proc_error_per-message_timeout_exceeded"},
		{"timeout with failure_mode_allow continues", []string{"message_timeout: 0.1s", "failure_mode_allow: true"}, slow, 200, ""},
		{"gRPC error gives status_on_error", []string{"status_on_error: {code: 503}"}, grpcErr, 503, "ext_proc_error_gRPC_error_14{down}"},
		{"gRPC error defaults to 500", nil, grpcErr, 500, ""},
		{"gRPC error with failure_mode_allow continues", []string{"failure_mode_allow: true"}, grpcErr, 200, ""},
		{"server OK-close continues unprocessed", nil, okClose, 200, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lines := append([]string{"processing_mode: {request_header_mode: SEND, response_header_mode: SKIP}"}, tc.cfg...)
			s := newSetup(t, filterCfg(lines...), 1<<20, tc.script)
			r := s.do("GET", "/x", "")
			if r.status != tc.status || (tc.details != "" && r.details != tc.details) {
				t.Errorf("got %d %q, want %d %q", r.status, r.details, tc.status, tc.details)
			}
		})
	}
}

// The response path: response headers carry :status; a STREAMED response body is processed chunk by chunk
// and each event is flushed to the client as it comes (server-sent events are not held back).
func TestStreamedResponseIsFlushedPerChunk(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SEND, response_body_mode: STREAMED}"), 1<<20,
		func(t *testing.T, p *procStream) {
			m := p.next()
			if v, _ := headerOf(m, ":status"); v != "200" {
				t.Errorf("response headers :status = %q", v)
			}
			p.reply(respHeadersResp(nil))
			for {
				m, err := p.Recv()
				if err != nil {
					return
				}
				b := m.GetResponseBody()
				p.reply(respBodyResp(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{
					Body: []byte(strings.ReplaceAll(string(b.GetBody()), "event", "EVENT"))}}}))
				if b.GetEndOfStream() {
					return
				}
			}
		})
	release := make(chan struct{})
	handler := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "data: event1\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: event2\n\n")
	}
	s.a1.handler, s.a2.handler = handler, handler
	resp, err := http.Get(s.url + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n') // arrives while the upstream is still holding event2
	if err != nil || line != "data: EVENT1\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(rd)
	if !strings.Contains(string(rest), "data: EVENT2") {
		t.Errorf("rest %q", rest)
	}
}

// Router behaviour around the processor: a direct_response route still passes through the response path,
// and an unknown path gets the router's 404.
func TestDirectResponse(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SEND}"), 1<<20,
		func(t *testing.T, p *procStream) {
			m := p.next()
			if v, _ := headerOf(m, ":status"); v != "418" {
				t.Errorf(":status %q", v)
			}
			p.reply(respHeadersResp(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-seen", "1")}}}))
			passThrough(p)
		})
	r := s.do("GET", "/direct", "")
	if r.status != 418 || r.body != "teapot" || r.header.Get("x-seen") != "1" {
		t.Errorf("got %d %q %v", r.status, r.body, r.header)
	}
}

// E10 weighted_clusters: the split follows the weights.
func TestWeightedClusters(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SKIP}"), 1<<20, nil)
	for range 400 {
		s.do("GET", "/x", "", "x-route", "weighted")
	}
	a := s.a1.count() + s.a2.count()
	if b := s.b.count(); a+b != 400 || b < 250 || b > 350 {
		t.Errorf("a=%d b=%d, want about 100/300", a, b)
	}
}

// The response body in BUFFERED (one message, mutation replaces it, content-length follows) and
// FULL_DUPLEX_STREAMED (streamed_response chunks) modes.
func TestResponseBodyModes(t *testing.T) {
	upper := func(request bool) script {
		return func(t *testing.T, p *procStream) {
			p.next()
			p.reply(respHeadersResp(nil))
			m := p.next()
			p.reply(respBodyResp(&extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{
				Body: []byte(strings.ToUpper(string(m.GetResponseBody().GetBody())))}}}))
		}
	}
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SEND, response_body_mode: BUFFERED}"), 1<<20, upper(false))
	r := s.do("GET", "/x", "")
	if r.status != 200 || !strings.Contains(r.body, `"UPSTREAM"`) || r.header.Get("content-length") != fmt.Sprint(len(r.body)) {
		t.Errorf("BUFFERED response: %d %q cl=%s", r.status, r.body, r.header.Get("content-length"))
	}

	s = newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SEND, response_body_mode: FULL_DUPLEX_STREAMED, response_trailer_mode: SEND}"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			var body []byte
			for {
				m := p.next()
				body = append(body, m.GetResponseBody().GetBody()...)
				if m.GetResponseBody().GetEndOfStream() {
					break
				}
			}
			p.reply(respHeadersResp(&extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-processed", "1")}}}))
			p.reply(streamed(false, "[", false))
			p.reply(streamed(false, string(body)+"]", true))
		})
	r = s.do("GET", "/x", "")
	if r.status != 200 || !strings.HasPrefix(r.body, "[{") || !strings.HasSuffix(r.body, "]") || r.header.Get("x-processed") != "1" {
		t.Errorf("FULL_DUPLEX_STREAMED response: %d %q %v", r.status, r.body, r.header)
	}
}

// E5: CONTINUE_AND_REPLACE in a headers answer replaces the body; no body message follows.
func TestContinueAndReplace(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, response_header_mode: SKIP}"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next()
			p.reply(reqHeadersResp(&extprocv3.CommonResponse{Status: extprocv3.CommonResponse_CONTINUE_AND_REPLACE,
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte("replaced")}}}))
			if _, err := p.Recv(); err == nil {
				t.Error("a body message followed CONTINUE_AND_REPLACE")
			}
		})
	if r := s.do("POST", "/x", "original body"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if got := s.a1.lastOrOther(t, s.a2).Body; got != "replaced" {
		t.Errorf("upstream body %q", got)
	}
}
