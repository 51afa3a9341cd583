package envoysim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

type bodyMode = extprocfilterv3.ProcessingMode_BodySendMode

const (
	modeNone        = extprocfilterv3.ProcessingMode_NONE
	modeStreamed    = extprocfilterv3.ProcessingMode_STREAMED
	modeBuffered    = extprocfilterv3.ProcessingMode_BUFFERED
	modePartial     = extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
	modeFullDuplex  = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	defaultTimeout  = 200 * time.Millisecond
	chunkReadBuffer = 16 << 10 // HTTP/2 frame-sized body chunks, as Envoy forwards them
)

// localReply is a response Envoy generates itself (a 413, a 504, an immediate_response, ...).
type localReply struct {
	status  int
	headers headerMap
	body    []byte
	details string
}

func (l *localReply) Error() string { return fmt.Sprintf("local reply %d %s", l.status, l.details) }

// errBypass means the processor is out of the picture for the rest of the request: the request continues
// unprocessed (failure_mode_allow, or the server closed the stream with OK).
var errBypass = errors.New("ext_proc bypassed")

// received is one message (or the end) from the processor.
type received struct {
	resp *extprocv3.ProcessingResponse
	err  error
}

// filter is the ext_proc HTTP filter for one request: it owns the gRPC stream and applies the processor's
// answers to the request and the response.
type filter struct {
	dp       *DataPlane
	cfg      *extprocfilterv3.ExternalProcessor
	mode     *extprocfilterv3.ProcessingMode
	chk      *checker
	fwd      *headerForwardRules
	ctx      context.Context
	cancel   context.CancelFunc
	stream   extprocv3.ExternalProcessor_ProcessClient
	sendMu   sync.Mutex // the sender goroutine and the request goroutine both send; gRPC allows one at a time
	recv     chan received
	sentAny  bool
	complete bool // processing is over: immediate response sent, bypassed, or server closed
	// bodySeen is set once body data went out in FULL_DUPLEX_STREAMED, which forces fail-closed.
	bodySeen atomic.Bool
	mdMu     sync.Mutex
	metadata map[string]*structpb.Struct // the request's dynamic metadata, by namespace
	// requestDone is closed when the request body has gone through the processor (streaming modes);
	// requestErr, written before, says how it failed.
	requestDone chan struct{}
	requestErr  error
	// routeCleared is set when a response cleared the route cache, so routing re-runs.
	routeCleared bool
	// requestAttrs are the resolved request_attributes, sent once (requestAttrsSent).
	requestAttrs     map[string]*structpb.Struct
	requestAttrsSent bool
}

func newFilter(ctx context.Context, dp *DataPlane, remoteAddr string) *filter {
	cfg := dp.cfg.ExtProc
	mode := &extprocfilterv3.ProcessingMode{}
	if cfg.GetProcessingMode() != nil {
		mode = cfg.GetProcessingMode()
	}
	f := &filter{dp: dp, cfg: cfg, mode: mode, chk: dp.checker, fwd: dp.forward, metadata: map[string]*structpb.Struct{}}
	f.ctx, f.cancel = context.WithCancel(ctx)
	f.requestAttrs = requestAttributes(cfg.GetRequestAttributes(), remoteAddr)
	return f
}

// requestAttributes resolves the request attributes the filter asks for, as Envoy's attribute names mean them.
// Envoy sends the lot once, with the first request-path message, under the filter's name.
func requestAttributes(names []string, remoteAddr string) map[string]*structpb.Struct {
	if len(names) == 0 {
		return nil
	}
	fields := map[string]*structpb.Value{}
	for _, n := range names {
		switch n {
		case "source.address":
			fields[n] = structpb.NewStringValue(remoteAddr)
		case "source.port":
			if _, port, err := net.SplitHostPort(remoteAddr); err == nil {
				if p, err := strconv.Atoi(port); err == nil {
					fields[n] = structpb.NewNumberValue(float64(p))
				}
			}
		}
	}
	return map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
}

// attachRequestAttributes puts the request attributes on the first request-path message only.
func (f *filter) attachRequestAttributes(m *extprocv3.ProcessingRequest) {
	if f.requestAttrs == nil || f.requestAttrsSent {
		return
	}
	switch m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders, *extprocv3.ProcessingRequest_RequestBody,
		*extprocv3.ProcessingRequest_RequestTrailers:
		m.Attributes, f.requestAttrsSent = f.requestAttrs, true
	}
}

func (f *filter) sendsRequestHeaders() bool {
	return f.mode.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
}
func (f *filter) sendsResponseHeaders() bool {
	return f.mode.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_SKIP
}
func (f *filter) sendsRequestTrailers() bool {
	return f.mode.GetRequestTrailerMode() == extprocfilterv3.ProcessingMode_SEND
}
func (f *filter) sendsResponseTrailers() bool {
	return f.mode.GetResponseTrailerMode() == extprocfilterv3.ProcessingMode_SEND
}

func (f *filter) failureModeAllow() bool {
	// FULL_DUPLEX_STREAMED forces fail-closed once any body was sent (Filter::failureModeAllow()).
	return f.cfg.GetFailureModeAllow() && !f.bodySeen.Load()
}

func (f *filter) messageTimeout() time.Duration {
	if d := f.cfg.GetMessageTimeout(); d != nil {
		return d.AsDuration()
	}
	return defaultTimeout
}

func (f *filter) statusOnError() int {
	if s := f.cfg.GetStatusOnError(); s != nil && s.GetCode() != 0 {
		return int(s.GetCode())
	}
	return http.StatusInternalServerError
}

// open starts the gRPC stream lazily, at the first message, as Envoy does.
func (f *filter) open() error {
	if f.stream != nil {
		return nil
	}
	client, ctx := f.dp.processorClient(f.ctx, f.dp.initialMetadata())
	s, err := client.Process(ctx)
	if err != nil {
		return err
	}
	f.stream = s
	f.recv = make(chan received, 64)
	go func() {
		for {
			r, err := s.Recv()
			f.recv <- received{r, err}
			if err != nil {
				return
			}
		}
	}()
	return nil
}

// close ends the stream: a half-close, then the context is cancelled (a reset) when the request is done.
func (f *filter) close() {
	if f.stream != nil {
		f.sendMu.Lock()
		_ = f.stream.CloseSend()
		f.sendMu.Unlock()
	}
	f.cancel()
}

// send transmits one message, adding protocol_config to the first and metadata_context to every message.
func (f *filter) send(m *extprocv3.ProcessingRequest) error {
	if f.complete {
		return errBypass
	}
	if err := f.open(); err != nil {
		return f.grpcFailure(err)
	}
	if !f.sentAny {
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:                         f.mode.GetRequestBodyMode(),
			ResponseBodyMode:                        f.mode.GetResponseBodyMode(),
			SendBodyWithoutWaitingForHeaderResponse: f.cfg.GetSendBodyWithoutWaitingForHeaderResponse(),
		}
		f.sentAny = true
	}
	if md := f.metadataContext(); md != nil {
		m.MetadataContext = md
	}
	f.attachRequestAttributes(m)
	if err := f.sendLocked(m); err != nil {
		if errors.Is(err, io.EOF) {
			// The server closed the stream; its status arrives through Recv.
			return f.await(0, nil)
		}
		return f.grpcFailure(err)
	}
	return nil
}

// metadataContext forwards the namespaces listed in forwarding_namespaces.
func (f *filter) metadataContext() *corev3.Metadata {
	names := f.cfg.GetMetadataOptions().GetForwardingNamespaces().GetUntyped()
	if len(names) == 0 {
		return nil
	}
	f.mdMu.Lock()
	defer f.mdMu.Unlock()
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, ns := range names {
		if s, ok := f.metadata[ns]; ok {
			md.FilterMetadata[ns] = s
		}
	}
	if len(md.FilterMetadata) == 0 {
		return nil
	}
	return md
}

// grpcFailure maps a stream error: bypass with failure_mode_allow, else status_on_error.
func (f *filter) grpcFailure(err error) error {
	f.complete = true
	if f.failureModeAllow() {
		return errBypass
	}
	st := status.Convert(err)
	return &localReply{status: f.statusOnError(), body: []byte("ext_proc error"),
		details: fmt.Sprintf("ext_proc_error_gRPC_error_%d{%s}", st.Code(), st.Message())}
}

// spurious handles an answer that does not match what the filter waits for.
func (f *filter) spurious(what string) error {
	f.complete = true
	f.cancel()
	if f.failureModeAllow() {
		return errBypass
	}
	return &localReply{status: f.statusOnError(), body: []byte("ext_proc error: spurious message"),
		details: "ext_proc_error_spurious_message_" + what}
}

// await waits for the next answer. timeout 0 means no timer (FULL_DUPLEX_STREAMED). An immediate_response
// becomes a *localReply, a server OK-close errBypass, a gRPC error or timeout the configured failure.
func (f *filter) await(timeout time.Duration, want func(*extprocv3.ProcessingResponse) bool) error {
	_, err := f.awaitResp(timeout, want)
	return err
}

func (f *filter) awaitResp(timeout time.Duration, want func(*extprocv3.ProcessingResponse) bool) (*extprocv3.ProcessingResponse, error) {
	if f.complete {
		return nil, errBypass
	}
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case r := <-f.recv:
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				// A server that closes the stream with OK means "continue unprocessed".
				f.complete = true
				return nil, errBypass
			}
			if status.Code(r.err) == codes.Canceled && f.ctx.Err() != nil {
				return nil, f.ctx.Err()
			}
			return nil, f.grpcFailure(r.err)
		}
		f.applyMetadata(r.resp.GetDynamicMetadata())
		if ir := r.resp.GetImmediateResponse(); ir != nil {
			if f.cfg.GetDisableImmediateResponse() {
				return nil, f.spurious("immediate_response")
			}
			return nil, f.immediate(ir)
		}
		if want != nil && !want(r.resp) {
			return nil, f.spurious(fmt.Sprintf("%T", r.resp.GetResponse()))
		}
		return r.resp, nil
	case <-timer:
		f.complete = true
		f.cancel()
		if f.failureModeAllow() {
			return nil, errBypass
		}
		return nil, &localReply{status: http.StatusGatewayTimeout, body: []byte("ext_proc message timeout"),
			details: "ext_proc_error_per-message_timeout_exceeded"}
	case <-f.ctx.Done():
		return nil, f.ctx.Err()
	}
}

// applyMetadata writes the processor's dynamic metadata, but only the namespaces listed in
// receiving_namespaces: with the list empty, all of it is dropped.
func (f *filter) applyMetadata(md *structpb.Struct) {
	if md == nil {
		return
	}
	allowed := f.cfg.GetMetadataOptions().GetReceivingNamespaces().GetUntyped()
	f.mdMu.Lock()
	defer f.mdMu.Unlock()
	for ns, v := range md.GetFields() {
		if !contains(allowed, ns) || v.GetStructValue() == nil {
			continue
		}
		cur, ok := f.metadata[ns]
		if !ok {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			f.metadata[ns] = cur
		}
		for k, val := range v.GetStructValue().GetFields() {
			cur.Fields[k] = val
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// immediate turns an immediate_response into a local reply and ends processing.
func (f *filter) immediate(ir *extprocv3.ImmediateResponse) error {
	f.complete = true
	code := int(ir.GetStatus().GetCode())
	if code < 200 {
		code = 200
	}
	lr := &localReply{status: code, body: ir.GetBody(), details: ir.GetDetails()}
	if err := f.chk.applyMutation(&lr.headers, ir.GetHeaders(), false, false); err != nil {
		return &localReply{status: f.statusOnError(), body: []byte("ext_proc error"), details: "ext_proc_error_immediate_response_headers"}
	}
	return lr
}

// clearsRoute reports whether a CommonResponse clears the route cache: only with a header mutation in the
// same response, and per route_cache_action.
func (f *filter) clearsRoute(cr *extprocv3.CommonResponse) bool {
	if cr.GetHeaderMutation() == nil || f.cfg.GetDisableClearRouteCache() {
		return false
	}
	switch f.cfg.GetRouteCacheAction() {
	case extprocfilterv3.ExternalProcessor_CLEAR:
		return true
	case extprocfilterv3.ExternalProcessor_RETAIN:
		return false
	}
	return cr.GetClearRouteCache()
}

// buildForwardRules turns forward_rules into a predicate on header names.
func buildForwardRules(cfg *extprocfilterv3.ExternalProcessor) *headerForwardRules {
	fr := cfg.GetForwardRules()
	if fr == nil {
		return nil
	}
	r := &headerForwardRules{}
	if a := fr.GetAllowedHeaders(); a != nil {
		r.allowed = func(k string) bool { return matchAny(a.GetPatterns(), k) }
	}
	if d := fr.GetDisallowedHeaders(); d != nil {
		r.disallowed = func(k string) bool { return matchAny(d.GetPatterns(), k) }
	}
	return r
}

func matchAny(ms []*matcherv3.StringMatcher, s string) bool {
	for _, m := range ms {
		if stringMatch(m, s) {
			return true
		}
	}
	return false
}

// stringMatch evaluates an Envoy StringMatcher.
func stringMatch(m *matcherv3.StringMatcher, s string) bool {
	if m.GetIgnoreCase() {
		s = strings.ToLower(s)
	}
	lower := func(p string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(p)
		}
		return p
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return s == lower(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(s, lower(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(s, lower(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(s, lower(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		return compiledRegex(p.SafeRegex.GetRegex()).MatchString(s)
	}
	return false
}

// removesContentLength says whether Envoy drops content-length from the forwarded headers in this mode.
func (f *filter) removesContentLength(body bodyMode, headerSent bool) bool {
	if f.cfg.GetAllowContentLengthHeader() {
		return false
	}
	switch body {
	case modeStreamed, modePartial, modeFullDuplex:
		return true
	case modeBuffered:
		return !headerSent
	}
	return false
}

func headersMsg(request bool, h *headerMap, rules *headerForwardRules, endOfStream bool) *extprocv3.ProcessingRequest {
	hh := &extprocv3.HttpHeaders{Headers: h.proto(rules), EndOfStream: endOfStream}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}}
}

func bodyMsg(request bool, b []byte, endOfStream bool) *extprocv3.ProcessingRequest {
	hb := &extprocv3.HttpBody{Body: b, EndOfStream: endOfStream}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}}
}

func trailersMsg(request bool, h *headerMap) *extprocv3.ProcessingRequest {
	ht := &extprocv3.HttpTrailers{Trailers: h.proto(nil)}
	if request {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: ht}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: ht}}
}

func isRequestHeaders(r *extprocv3.ProcessingResponse) bool { return r.GetRequestHeaders() != nil }
func isRequestBody(r *extprocv3.ProcessingResponse) bool    { return r.GetRequestBody() != nil }
func isRequestTrailers(r *extprocv3.ProcessingResponse) bool {
	return r.GetRequestTrailers() != nil
}
func isResponseHeaders(r *extprocv3.ProcessingResponse) bool { return r.GetResponseHeaders() != nil }
func isResponseBody(r *extprocv3.ProcessingResponse) bool    { return r.GetResponseBody() != nil }
func isResponseTrailers(r *extprocv3.ProcessingResponse) bool {
	return r.GetResponseTrailers() != nil
}

// headersCommon extracts the CommonResponse of a headers answer in either direction.
func headersCommon(r *extprocv3.ProcessingResponse) *extprocv3.CommonResponse {
	if h := r.GetRequestHeaders(); h != nil {
		return h.GetResponse()
	}
	return r.GetResponseHeaders().GetResponse()
}

func bodyCommon(r *extprocv3.ProcessingResponse) *extprocv3.CommonResponse {
	if b := r.GetRequestBody(); b != nil {
		return b.GetResponse()
	}
	return r.GetResponseBody().GetResponse()
}

// mutatedBody applies a non-streamed BodyMutation to data.
func mutatedBody(m *extprocv3.BodyMutation, data []byte) []byte {
	switch mm := m.GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return mm.Body
	case *extprocv3.BodyMutation_ClearBody:
		if mm.ClearBody {
			return nil
		}
	}
	return data
}

func itoa(n int) string { return strconv.Itoa(n) }

// namespace returns a copy-safe view of one dynamic metadata namespace.
func (f *filter) namespace(ns string) *structpb.Struct {
	f.mdMu.Lock()
	defer f.mdMu.Unlock()
	return f.metadata[ns]
}

// setMetadata writes one string into the request's dynamic metadata (the LB reporting the served host).
func (f *filter) setMetadata(ns, key, value string) {
	f.mdMu.Lock()
	defer f.mdMu.Unlock()
	cur, ok := f.metadata[ns]
	if !ok {
		cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		f.metadata[ns] = cur
	}
	cur.Fields[key] = structpb.NewStringValue(value)
}

func (f *filter) sendLocked(m *extprocv3.ProcessingRequest) error {
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	return f.stream.Send(m)
}
