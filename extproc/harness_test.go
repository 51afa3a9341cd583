package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

const (
	keyAcme    = "sk-demo-acme"
	keyInitech = "sk-demo-initech"
)

const (
	modeBuffered   = filterv3.ProcessingMode_BUFFERED
	modeFullDuplex = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	modeStreamed   = filterv3.ProcessingMode_STREAMED
	modeNone       = filterv3.ProcessingMode_NONE
)

// harness runs a real ext_proc gRPC server on loopback and talks to it as Envoy would.
type harness struct {
	t        *testing.T
	client   extprocv3.ExternalProcessorClient
	conn     *grpc.ClientConn
	inflight *fleet.InFlight
	settled  chan director.Settlement
	store    *policies.Store
	srv      *Server
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return newHarnessWith(t, snap, config{})
}

// config is a test server's options: the protocol stage's, and those of the director behind it.
type config struct {
	Options
	Director director.Options
}

// newServer builds a Server over store with a director of c.Director (its store, clock and logger filled in).
func newServer(store *policies.Store, c config) *Server {
	c.Options.Policies, c.Director.Policies = store, store
	if c.Director.Now == nil {
		c.Director.Now = c.Options.Now
	}
	c.Options.Director = director.New(c.Director)
	return New(c.Options)
}

// newHarnessWith serves a given policy with extra options (quotas, engine metrics); the harness fills in the
// policy store, the in-flight counter and the settlement hook.
func newHarnessWith(t *testing.T, snap *policies.Snapshot, c config) *harness {
	t.Helper()
	h := &harness{t: t, inflight: &fleet.InFlight{}, settled: make(chan director.Settlement, 64), store: policies.NewStaticStore(snap)}
	c.Director.InFlight = h.inflight
	c.Director.Observers = append(c.Director.Observers, director.OnRouted(func(s director.Settlement) {
		select {
		case h.settled <- s:
		default: // a test that reads none past 64 does not hold its handlers, which Stop waits for
		}
	}))
	srv := newServer(h.store, c)
	h.srv = srv
	// Stop waits for the handlers: none outlives its test (TestLargeBodiesGiveTheNetworkTurns counts the
	// process's turns).
	gs := grpc.NewServer(append(ServerOptions(), grpc.WaitForHandlers(true))...)
	srv.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); gs.Stop() })
	h.conn, h.client = conn, extprocv3.NewExternalProcessorClient(conn)
	return h
}

// settlement waits for the next settlement.
func (h *harness) settlement() director.Settlement {
	h.t.Helper()
	select {
	case s := <-h.settled:
		return s
	case <-time.After(10 * time.Second):
		h.t.Fatal("no settlement")
	}
	return director.Settlement{}
}

func (h *harness) noSettlement() {
	h.t.Helper()
	select {
	case s := <-h.settled:
		h.t.Fatalf("unexpected settlement %+v", s)
	default:
	}
}

type stream struct {
	t        *testing.T
	c        extprocv3.ExternalProcessor_ProcessClient
	cancel   context.CancelFunc
	sentAny  bool
	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode
}

func (h *harness) open(t *testing.T, reqMode, respMode filterv3.ProcessingMode_BodySendMode) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c, err := h.client.Process(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return &stream{t: t, c: c, cancel: cancel, reqMode: reqMode, respMode: respMode}
}

func (s *stream) send(m *extprocv3.ProcessingRequest) {
	s.t.Helper()
	if !s.sentAny {
		// Envoy sets protocol_config on the first message of a stream only.
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: s.reqMode, ResponseBodyMode: s.respMode}
		s.sentAny = true
	}
	if err := s.c.Send(m); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

func (s *stream) recv() *extprocv3.ProcessingResponse {
	s.t.Helper()
	r, err := s.c.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return r
}

// recvStreamed reads streamed_response chunks of the request (or response) body until end_of_stream, and fails
// after max messages without it rather than waiting for the stream's deadline.
func (s *stream) recvStreamed(request bool, max int) []byte {
	s.t.Helper()
	var out []byte
	for range max {
		r := s.recv()
		br := r.GetResponseBody()
		if request {
			br = r.GetRequestBody()
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			s.t.Fatalf("expected a streamed_response chunk, got %v", r)
		}
		out = append(out, sr.GetBody()...)
		if sr.GetEndOfStream() {
			return out
		}
	}
	s.t.Fatalf("no end_of_stream in %d chunks", max)
	return nil
}

// expectClosed checks the server ended the stream with OK status.
func (s *stream) expectClosed() {
	s.t.Helper()
	_ = s.c.CloseSend()
	r, err := s.c.Recv()
	if !errors.Is(err, io.EOF) {
		s.t.Fatalf("expected the server to close the stream, got %v / %v", r, err)
	}
}

func headerMap(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

func reqHeaders(endOfStream bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(kv...), EndOfStream: endOfStream}}}
}

// chatHeaders are the headers of a POST to /v1/chat/completions with a key.
func postHeaders(path, key string, extra ...string) *extprocv3.ProcessingRequest {
	kv := []string{":method", "POST", ":path", path, ":authority", "gw", ":scheme", "http",
		"content-type", "application/json"}
	if key != "" {
		kv = append(kv, "authorization", "Bearer "+key)
	}
	return reqHeaders(false, append(kv, extra...)...)
}

func reqBody(b []byte, endOfStream bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: endOfStream}}}
}

func reqTrailers() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{Trailers: headerMap("x-t", "1")}}}
}

func respHeaders(status string, endOfStream bool, kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(append([]string{":status", status}, kv...)...),
			EndOfStream: endOfStream}}}
}

func respBody(b []byte, endOfStream bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: endOfStream}}}
}

// setHeaders returns the headers a mutation sets, as a map.
func setHeaders(hm *extprocv3.HeaderMutation) map[string]string {
	out := map[string]string{}
	for _, h := range hm.GetSetHeaders() {
		if h.GetHeader().GetValue() != "" {
			panic("header set with value instead of raw_value: Envoy would send it empty")
		}
		out[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// immediateError checks an immediate response carries an OpenAI-shaped error and returns status and code.
func immediateError(t *testing.T, r *extprocv3.ProcessingResponse) (int, string) {
	t.Helper()
	ir := r.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("expected immediate_response, got %v", r)
	}
	if ct := setHeaders(ir.GetHeaders())["content-type"]; ct != "application/json" {
		t.Errorf("content-type = %q", ct)
	}
	var env struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(ir.GetBody(), &env); err != nil || env.Error.Message == "" || env.Error.Type == "" {
		t.Fatalf("error body not OpenAI-shaped: %s (%v)", ir.GetBody(), err)
	}
	code := ""
	if env.Error.Code != nil {
		code = *env.Error.Code
	}
	if !strings.HasPrefix(ir.GetDetails(), "infergate_") {
		t.Errorf("details = %q", ir.GetDetails())
	}
	return int(ir.GetStatus().GetCode()), code
}

// lbDestination reads x-gateway-destination-endpoint from envoy.lb dynamic metadata.
func lbDestination(r *extprocv3.ProcessingResponse) string {
	return r.GetDynamicMetadata().GetFields()[contract.MetadataNamespace].GetStructValue().GetFields()[contract.HeaderDestination].GetStringValue()
}

func codeOf(err error) codes.Code { return status.Code(err) }
