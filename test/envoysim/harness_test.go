package envoysim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// The tests below check the behaviour docs/architecture.md lists (E1-E10): a scripted processor plays the server
// side, an echo upstream records what reached it, and each test checks one rule of the spec.

// script is what a fake processor does with one stream.
type script func(t *testing.T, s *procStream)

// procStream wraps the server side of a stream and records the messages it saw.
type procStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	t    *testing.T
	seen []*extprocv3.ProcessingRequest
}

func (p *procStream) next() *extprocv3.ProcessingRequest {
	p.t.Helper()
	m, err := p.Recv()
	if err != nil {
		p.t.Errorf("processor recv: %v", err)
		return &extprocv3.ProcessingRequest{}
	}
	p.seen = append(p.seen, m)
	return m
}

func (p *procStream) reply(r *extprocv3.ProcessingResponse) {
	p.t.Helper()
	if err := p.Send(r); err != nil {
		p.t.Errorf("processor send: %v", err)
	}
}

// fakeProcessor serves the scripts; streams counts the streams opened.
type fakeProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	t       *testing.T
	mu      sync.Mutex
	script  script
	streams int
	done    chan *procStream
}

func (f *fakeProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	f.mu.Lock()
	f.streams++
	sc := f.script
	f.mu.Unlock()
	ps := &procStream{ExternalProcessor_ProcessServer: s, t: f.t}
	defer func() { f.done <- ps }()
	if sc == nil {
		return nil
	}
	sc(f.t, ps)
	return errFromScript(ps)
}

// errFromScript lets a script end the stream with a gRPC error by storing it.
func errFromScript(ps *procStream) error { return ps.err() }

var scriptErrs sync.Map // *procStream -> error

func (p *procStream) fail(err error) { scriptErrs.Store(p, err) }
func (p *procStream) err() error {
	if v, ok := scriptErrs.Load(p); ok {
		return v.(error)
	}
	return nil
}

// upstream is an echo server: it reports the request it got as JSON, unless a handler is set.
type upstream struct {
	addr    string
	mu      sync.Mutex
	got     []seenRequest
	handler http.HandlerFunc
}

type seenRequest struct {
	Headers http.Header
	Body    string
	Host    string
	Addr    string
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = lis.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, seenRequest{Headers: r.Header.Clone(), Body: string(b), Host: r.Host, Addr: u.addr})
		h := u.handler
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"upstream": u.addr, "body": string(b)})
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	return u
}

func (u *upstream) last(t *testing.T) seenRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.got) == 0 {
		t.Fatal("nothing reached the upstream")
	}
	return u.got[len(u.got)-1]
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.got)
}

// setup is one test's world: processor, two upstream clusters (a: two endpoints, b: one) and the data plane.
type setup struct {
	t      *testing.T
	proc   *fakeProcessor
	a1, a2 *upstream
	b      *upstream
	dead   string // an address nobody listens on, listed in cluster a
	url    string
}

// filterYAML is the ext_proc filter config under test, indented for the template.
const configTemplate = `
static_resources:
  listeners:
  - name: test
    address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
    per_connection_buffer_limit_bytes: %d
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: test%s
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: proc}}
%s
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/", headers: [{name: x-route, string_match: {exact: b}}]}
                route: {cluster: b}
              - match: {prefix: "/", headers: [{name: x-route, string_match: {exact: weighted}}]}
                route: {weighted_clusters: {clusters: [{name: a, weight: 1}, {name: b, weight: 3}]}, retry_policy: {retry_on: connect-failure, num_retries: 2}}
              - match: {prefix: "/idle"}
                route: {cluster: b, idle_timeout: 0.3s}
              - match: {prefix: "/direct"}
                direct_response: {status: 418, body: {inline_string: "teapot"}}
              - match: {prefix: "/"}
                route: {cluster: a, retry_policy: {retry_on: connect-failure, num_retries: 2}}
  clusters:
  - name: proc
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment: {cluster_name: proc, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 1}}}}]}]}
  - name: a
    type: STATIC
    connect_timeout: 0.5s
    load_balancing_policy: &oh
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            - metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}
            selected_host_key: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint-served}]}
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.least_request
                  typed_config: {"@type": type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest}
    load_assignment:
      cluster_name: a
      endpoints: [{lb_endpoints: [
        {endpoint: {address: {socket_address: {address: 10.255.0.1, port_value: 1}}}},
        {endpoint: {address: {socket_address: {address: 10.255.0.2, port_value: 2}}}},
        {endpoint: {address: {socket_address: {address: 10.255.0.3, port_value: 3}}}}]}]
  - name: b
    type: STATIC
    load_balancing_policy: *oh
    load_assignment:
      cluster_name: b
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 10.255.1.1, port_value: 1}}}}]}]
`

// newSetup starts everything; filter is the ext_proc filter's YAML fields (processing_mode etc.) at 14 spaces.
func newSetup(t *testing.T, filter string, bufferLimit int, sc script) *setup {
	t.Helper()
	return newSetupHCM(t, "", filter, bufferLimit, sc)
}

// newSetupHCM is newSetup with extra HTTP connection manager fields (one per line, at 10 spaces).
func newSetupHCM(t *testing.T, hcm, filter string, bufferLimit int, sc script) *setup {
	t.Helper()
	s := &setup{t: t, proc: &fakeProcessor{t: t, script: sc, done: make(chan *procStream, 16)}}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, s.proc)
	plis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(plis) }()
	t.Cleanup(gs.Stop)
	s.a1, s.a2, s.b = startUpstream(t), startUpstream(t), startUpstream(t)
	deadLis, _ := net.Listen("tcp", "127.0.0.1:0")
	s.dead = deadLis.Addr().String()
	deadLis.Close()
	cfg, err := Parse([]byte(fmt.Sprintf(configTemplate, bufferLimit, hcm, filter)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	dp, err := New(cfg, Options{ExtProcAddr: plis.Addr().String(), Upstreams: map[string]string{
		"10.255.0.1:1": s.a1.addr, "10.255.0.2:2": s.a2.addr, "10.255.0.3:3": s.dead, "10.255.1.1:1": s.b.addr,
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = dp.Serve(ctx, lis) }()
	s.url = "http://" + lis.Addr().String()
	return s
}

// stream returns the processor's view of the next finished stream.
func (s *setup) stream() *procStream {
	s.t.Helper()
	select {
	case ps := <-s.proc.done:
		return ps
	case <-time.After(10 * time.Second):
		s.t.Fatal("no ext_proc stream finished")
	}
	return nil
}

type result struct {
	status  int
	header  http.Header
	body    string
	details string
}

func (s *setup) do(method, path, body string, hdr ...string) result {
	s.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	return s.send(req, hdr...)
}

// send sets the headers (Host as the request host) and returns what the client got.
func (s *setup) send(req *http.Request, hdr ...string) result {
	s.t.Helper()
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), details: resp.Header.Get(DetailsHeader)}
}

// ---- response builders, as a processor writes them ----

func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}}
}

func reqHeadersResp(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func reqBodyResp(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
}

func respHeadersResp(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func respBodyResp(cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if cr == nil {
		cr = &extprocv3.CommonResponse{}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
}

func streamed(request bool, body string, end bool) *extprocv3.ProcessingResponse {
	cr := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(body), EndOfStream: end}}}}
	if request {
		return reqBodyResp(cr)
	}
	return respBodyResp(cr)
}

func lbMetadata(dest string) *structpb.Struct {
	s, _ := structpb.NewStruct(map[string]any{"envoy.lb": map[string]any{"x-gateway-destination-endpoint": dest}})
	return s
}

func headerOf(m *extprocv3.ProcessingRequest, key string) (string, bool) {
	hs := m.GetRequestHeaders()
	if hs == nil {
		hs = m.GetResponseHeaders()
	}
	for _, h := range hs.GetHeaders().GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue()), true
		}
	}
	return "", false
}

// untilEnd drains the stream's remaining messages, answering each headers/body message in order (a
// pass-through processor for the parts a test does not look at).
func passThrough(p *procStream) {
	for {
		m, err := p.Recv()
		if err != nil {
			return
		}
		p.seen = append(p.seen, m)
		switch m.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			p.reply(reqHeadersResp(nil))
		case *extprocv3.ProcessingRequest_RequestBody:
			p.reply(reqBodyResp(nil))
		case *extprocv3.ProcessingRequest_RequestTrailers:
			p.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			p.reply(respHeadersResp(nil))
		case *extprocv3.ProcessingRequest_ResponseBody:
			p.reply(respBodyResp(nil))
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			p.reply(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
		}
	}
}
