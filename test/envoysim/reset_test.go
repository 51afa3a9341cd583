package envoysim

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// An upstream that cuts its response body mid-stream in FULL_DUPLEX_STREAMED: Envoy resets the downstream
// stream (the client sees a broken body, not a clean end and not a stall) and closes the ext_proc stream.
func TestFullDuplexUpstreamCutResetsDownstream(t *testing.T) {
	procEnded := make(chan error, 1)
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SEND, response_body_mode: FULL_DUPLEX_STREAMED, response_trailer_mode: SEND}"), 1<<20,
		func(t *testing.T, p *procStream) {
			p.next() // response headers
			p.reply(respHeadersResp(nil))
			for {
				m, err := p.Recv()
				if err != nil {
					procEnded <- err
					return
				}
				if b := m.GetResponseBody(); b != nil {
					p.reply(streamed(false, string(b.GetBody()), b.GetEndOfStream()))
				}
			}
		})
	cut := make(chan struct{})
	handler := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-cut // the client has the first event
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close() // the replica dies mid-stream: no terminating chunk
		}
	}
	s.a1.handler, s.a2.handler = handler, handler
	resp, err := http.Get(s.url + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	close(cut)
	rest, err := io.ReadAll(rd)
	if err == nil {
		t.Fatalf("the body ended cleanly after the upstream was cut (rest %q); Envoy resets the stream", rest)
	}
	if strings.Contains(string(rest), "first") {
		t.Errorf("rest %q", rest)
	}
	if err := <-procEnded; err == nil {
		t.Error("the processor's stream did not end")
	}
}

// request_attributes go once, on the first request-path message, under the filter's name.
func TestRequestAttributesOnFirstMessage(t *testing.T) {
	got := make(chan [2]string, 1)
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: BUFFERED, response_header_mode: SKIP}",
		`request_attributes: ["source.address"]`), 1<<20,
		func(t *testing.T, p *procStream) {
			first := p.next()
			p.reply(reqHeadersResp(nil))
			second := p.next()
			p.reply(reqBodyResp(nil))
			attr := func(m *extprocv3.ProcessingRequest) string {
				return m.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["source.address"].GetStringValue()
			}
			got <- [2]string{attr(first), attr(second)}
		})
	s.do("POST", "/v1/chat/completions", `{"x":1}`)
	a := <-got
	if host, _, err := net.SplitHostPort(a[0]); err != nil || host != "127.0.0.1" {
		t.Errorf("first message source.address %q", a[0])
	}
	if a[1] != "" {
		t.Errorf("attributes sent again on the body: %q", a[1])
	}
}

// A client that declares a longer body than it sends gets Envoy's 408 when request_timeout runs out, in
// every request body mode, instead of holding the stream.
func TestRequestTimeoutForShortBody(t *testing.T) {
	for _, mode := range []string{"BUFFERED", "FULL_DUPLEX_STREAMED"} {
		t.Run(mode, func(t *testing.T) {
			trailers := ""
			if mode == "FULL_DUPLEX_STREAMED" {
				trailers = ", request_trailer_mode: SEND"
			}
			s := newSetupHCM(t, "\n          request_timeout: 0.3s",
				filterCfg("processing_mode: {request_header_mode: SEND, request_body_mode: "+mode+trailers+", response_header_mode: SKIP}"), 1<<20,
				func(t *testing.T, p *procStream) {
					if mode == "BUFFERED" {
						p.next()
						p.reply(reqHeadersResp(nil))
					}
					for {
						if _, err := p.Recv(); err != nil {
							return
						}
					}
				})
			conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout || string(body) != "request timeout" {
				t.Errorf("got %d %q %v, want 408 request timeout", resp.StatusCode, body, resp.Header)
			}
		})
	}
}

// The route's idle_timeout: a replica that sends nothing gets its request a 408 before the response headers,
// and a stream that stalls after them is reset — never a request held for the five-minute route timeout.
func TestRouteIdleTimeout(t *testing.T) {
	s := newSetup(t, filterCfg("processing_mode: {request_header_mode: SKIP, response_header_mode: SKIP}"), 1<<20, nil)
	var stall atomic.Bool
	s.b.handler = func(w http.ResponseWriter, r *http.Request) {
		if stall.Load() {
			w.Header().Set("content-type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done() // hung engine
	}
	r := s.do("POST", "/idle", `{}`)
	if r.status != http.StatusRequestTimeout || r.details != "stream_idle_timeout" {
		t.Errorf("hung upstream: %d %q %q", r.status, r.details, r.body)
	}
	stall.Store(true)
	resp, err := http.Post(s.url+"/idle", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first event %q %v", line, err)
	}
	if _, err := io.ReadAll(rd); err == nil {
		t.Error("a stalled stream ended cleanly; Envoy resets it")
	}
}
