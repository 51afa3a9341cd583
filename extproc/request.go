package extproc

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/audit"
	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/telemetry"
)

// streamChunkBytes is the size of streamed_response chunks sent back in FULL_DUPLEX_STREAMED mode; Envoy
// recommends at most 64 KiB per chunk, and the reference endpoint picker uses 62,000 bytes.
const streamChunkBytes = 62000

// maxResponseBodyBytes bounds how much of a non-streaming response is held to read its usage.
const maxResponseBodyBytes = 16 << 20

type bodyMode = filterv3.ProcessingMode_BodySendMode

// requestState follows one HTTP request through its ext_proc stream. It is used by one goroutine.
type requestState struct {
	srv *Server
	ctx context.Context
	// edgeRegion is the region of the Envoy that opened the stream, when its configuration names it
	// (contract.EdgeRegionMetadata): another region's Envoy that failed over to this gateway.
	edgeRegion string

	seenFirst bool
	// declaredLen is the request's content-length, -1 when it has none.
	declaredLen int64
	reqMode     bodyMode
	respMode    bodyMode
	finished    bool // an immediate response was sent

	// request path
	started   time.Time
	snap      *policies.Snapshot
	tenant    *policies.Tenant
	endpoint  openai.Endpoint
	requestID string
	hadReqID  bool
	strip     []string // client-supplied routing headers to remove
	source    string   // the client's IP, when Envoy sends the source.address attribute
	body      []byte
	held      int64                         // body bytes taken from the server's body budget
	awaitBody int64                         // a large BUFFERED body's declared length, to admit through the receive gate before reading on
	admitted  *admission                    // what the receive gate admitted, given back with the body
	finishing *extprocv3.ProcessingResponse // an immediate response decided between messages
	limit     int64
	decided   bool

	// routing decision
	route        *director.Route // &routed once the request is routed
	routed       director.Route
	destination  string         // the decision's endpoints, comma-separated
	parsed       openai.Request // the body's routed fields, until the decision is made
	stream       bool
	conversation string
	rolloutArm   string // the client's rollout header (only testers' counts)

	// response path
	upstreamStatus int
	sse            *openai.SSEScanner
	respBody       []byte
	respTooBig     bool
	rename         *openai.ModelRenamer          // a JSON response's model, renamed as it passes
	respEnded      bool                          // the response body's end went back to Envoy (FULL_DUPLEX_STREAMED)
	served         string                        // the endpoint Envoy reports it sent the request to, when it does
	pooledBody     *[]byte                       // the shared-pool buffer rs.body lives in, returned at close
	rewritten      *[]byte                       // the rewritten body's shared-pool buffer, until sent or handed over
	handOver       *extprocv3.ProcessingResponse // the answer that takes rewritten along to gRPC (handedOverBody)
	in             pooledRequest                 // the message in hand and its shared-pool buffer, if any
	// deferSettle (set by Process) settles an ended response once the answer is sent (settleOnceSent);
	// settleDue says one is waiting, endedAt when its response ended.
	deferSettle bool
	settleDue   bool
	endedAt     time.Time

	// answers built in place (answers.go)
	reqHeadersAnswer requestHeadersAnswer
	decision         decisionAnswer
	respAnswer       responseHeadersAnswer

	// telemetry
	traceparent, tracestate string
	trace                   *telemetry.Request // nil without tracing
	timing                  responseTiming
	output                  *audit.Digester // the generated text's digest, with Options.DigestKey
	answer                  *boundedText    // the generated text, kept for a shadow pair (Route.PairsAnswer)
	promptDigest            string          // the prompt's, taken as the request is routed
}

func (rs *requestState) log() *slog.Logger { return rs.srv.opts.Logger }

func (rs *requestState) now() time.Time { return rs.srv.opts.Now() }

// handle answers one message from Envoy; it may return zero, one or several responses.
func (rs *requestState) handle(msg *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	if !rs.seenFirst {
		rs.seenFirst = true
		rs.source = sourceOf(msg)
		rs.reqMode, rs.respMode = filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE
		if pc := msg.GetProtocolConfig(); pc != nil {
			rs.reqMode, rs.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
	}
	if rs.decided && rs.served == "" {
		rs.noteServed(msg)
	}
	switch r := msg.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return rs.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return rs.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return rs.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return rs.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return rs.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return rs.responseTrailers()
	}
	return nil
}

// reject ends the request with an OpenAI-shaped error.
func (rs *requestState) reject(e *openai.Error) []*extprocv3.ProcessingResponse {
	rs.finished = true
	rs.srv.metrics.Requests.WithLabelValues(e.Code).Inc()
	rs.trace.Reject(e.Status, e.Code, rs.now())
	rs.log().Debug("request rejected", "request_id", rs.requestID, "status", e.Status, "code", e.Code,
		"tenant", tenantName(rs.tenant))
	return one(immediate(e.Status, e.Body(), rs.requestID, "infergate_"+e.Code, e.Header))
}

// maxRequestIDBytes bounds a client-supplied x-request-id; a longer one is replaced.
const maxRequestIDBytes = 128

// validRequestID accepts ids of visible ASCII only (no spaces or control characters), up to 128 bytes.
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func tenantName(t *policies.Tenant) string {
	if t == nil {
		return ""
	}
	return t.Name
}

// requestHeaders authenticates the tenant and checks the method and path; the decision waits for the body.
func (rs *requestState) requestHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	rs.started = rs.now()
	rs.snap = rs.srv.opts.Policies.Current()
	rs.limit = rs.snap.Gateway().MaxRequestBodyBytes
	hdr := rs.readHeaders(h)
	rs.endpoint = openai.EndpointForPath(hdr.path)
	if rs.endpoint == openai.EndpointNone {
		return rs.reject(openai.NotFound(hdr.method, hdr.path))
	}
	if e := rs.authenticate(hdr.auth); e != nil {
		return rs.reject(e)
	}
	if rs.endpoint == openai.EndpointModels || rs.endpoint == openai.EndpointModel {
		return rs.answerModels(hdr)
	}
	// Inference requests only: a models list is no GenAI operation.
	rs.trace = rs.srv.opts.Tracing.Begin(rs.traceparent, rs.tracestate, rs.source, rs.endpoint, rs.started)
	if hdr.method != http.MethodPost {
		return rs.reject(openai.MethodNotAllowed(hdr.method, hdr.path))
	}
	if h.GetEndOfStream() {
		return rs.reject(openai.BadRequest("", "The request has no body; send a JSON object."))
	}
	rs.declaredLen = -1
	if hdr.contentLength != "" {
		n, err := strconv.ParseInt(hdr.contentLength, 10, 64)
		if err == nil {
			rs.declaredLen = n
		}
		if err == nil && n > rs.limit {
			return rs.reject(openai.BodyTooLarge(rs.limit))
		}
		// No buffer is reserved for the declared length: memory follows the bytes that really arrive, so
		// thousands of slow senders that declared large bodies hold nothing they have not sent.
	}
	switch rs.reqMode {
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy sends the body only after this answer; the routing headers follow in the body answer.
		if rs.declaredLen > largeBodyBytes {
			rs.awaitBody = rs.declaredLen
		}
		return rs.reqHeadersAnswer.build(rs.removals(nil))
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if rs.declaredLen > largeBodyBytes {
			rs.awaitBody = rs.declaredLen
		}
		return nil // answered once the whole body has been read
	default:
		return rs.reject(openai.Internal(
			"The gateway is misconfigured: ext_proc request body mode %s cannot carry the body to route on; use BUFFERED or FULL_DUPLEX_STREAMED.",
			rs.reqMode))
	}
}

// answerModels answers GET /v1/models (the models the tenant may call) and GET /v1/models/{id} (one of them,
// by any name it may use; 404 for any other, as OpenAI answers for a model the key cannot use).
func (rs *requestState) answerModels(hdr requestHeaderValues) []*extprocv3.ProcessingResponse {
	if hdr.method != http.MethodGet {
		return rs.reject(openai.MethodNotAllowed(hdr.method, hdr.path))
	}
	if rs.endpoint == openai.EndpointModel {
		id := openai.ModelID(hdr.path)
		if !rs.snap.AllowsName(rs.tenant, id) {
			return rs.reject(openai.ModelNotFound(id))
		}
		rs.finished = true
		rs.srv.metrics.Requests.WithLabelValues("models_get").Inc()
		return one(immediate(http.StatusOK, modelObject(id, rs.snap.LoadedAt), rs.requestID, "", nil))
	}
	rs.finished = true
	rs.srv.metrics.Requests.WithLabelValues("models_list").Inc()
	return one(immediate(http.StatusOK, modelList(rs.snap.NamesFor(rs.tenant), rs.snap.LoadedAt), rs.requestID, "", nil))
}

// requestHeaderValues are the request headers the gateway reads.
type requestHeaderValues struct {
	method, path, auth, contentLength string
}

// readHeaders reads the headers the gateway needs, notes the contract headers a client forged (to strip)
// and the request id, and generates one when the client's is missing or unusable.
func (rs *requestState) readHeaders(h *extprocv3.HttpHeaders) requestHeaderValues {
	var out requestHeaderValues
	convHeader := rs.snap.QuotaSettings().ConversationHeader
	for _, hv := range h.GetHeaders().GetHeaders() {
		key := strings.ToLower(hv.GetKey()) // Envoy sends lower case; be safe with other clients
		switch {
		case convHeader != "" && key == convHeader:
			rs.conversation = headerValue(hv)
		case key == ":method":
			out.method = headerValue(hv)
		case key == ":path":
			out.path = headerValue(hv)
		case key == "authorization":
			out.auth = headerValue(hv)
		case key == "content-length":
			out.contentLength = headerValue(hv)
		case key == "traceparent":
			rs.traceparent = headerValue(hv)
		case key == "tracestate":
			rs.tracestate = headerValue(hv)
		case key == contract.HeaderRequestID:
			// A client's id is kept only when it is a plain token: it is echoed in responses and logs, where
			// CR/LF or other control bytes would split headers and lines.
			if id := headerValue(hv); validRequestID(id) {
				rs.requestID, rs.hadReqID = id, true
			}
		case contract.Reserved(key):
			if key == contract.HeaderRollout {
				rs.rolloutArm = headerValue(hv)
			}
			rs.strip = append(rs.strip, key)
		}
	}
	if rs.requestID == "" {
		rs.requestID, rs.hadReqID = rand.Text(), false
	}
	return out
}

// authenticate finds the tenant of a bearer key. The key is looked up first (a hash lookup), so a valid key
// is never refused for what others did from the same address — many clients share one behind a NAT or a
// proxy; only a failure is throttled, past its address's failed-authentication budget.
func (rs *requestState) authenticate(auth string) *openai.Error {
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		key, ok = strings.CutPrefix(auth, "bearer ")
	}
	key = strings.TrimSpace(key)
	missing := !ok || key == ""
	if !missing {
		if rs.tenant, ok = rs.snap.TenantForKey(key); ok {
			return nil
		}
	}
	guard := rs.srv.auth
	if throttled, retry := guard.throttled(rs.source); throttled {
		return openai.TooManyAuthFailures(retry)
	}
	guard.failed(rs.source)
	return openai.InvalidAPIKey(missing)
}

func (rs *requestState) requestBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	if rs.decided {
		// FULL_DUPLEX_STREAMED data after the decision (only possible if Envoy sent trailers first); drop it.
		return nil
	}
	if int64(len(rs.body))+int64(len(b.GetBody())) > rs.limit {
		return rs.reject(openai.BodyTooLarge(rs.limit))
	}
	rs.admitted.arrived()
	if len(rs.body) > largeBodyBytes {
		netturn.Yield() // each frame of a large body gives way: netturn
	}
	if !rs.holdBody(int64(len(b.GetBody()))) {
		return rs.reject(openai.BodiesInFlight())
	}
	if len(rs.body) == 0 && rs.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		rs.body = b.GetBody() // the whole body in one message: use it in place, and its buffer with it
		if rs.in.buf != nil {
			if rs.pooledBody != nil {
				sharedBufferPool.Put(rs.pooledBody)
			}
			rs.pooledBody, rs.in.buf = rs.in.buf, nil
		}
	} else {
		rs.appendBody(b.GetBody())
	}
	switch rs.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if !b.GetEndOfStream() {
			if rs.admitted == nil && rs.declaredLen < 0 && len(rs.body) > largeBodyBytes {
				rs.awaitBody = rs.limit // no declared length: admitted as the largest body once it is large
			}
			return nil
		}
		if rs.declaredLen >= 0 && int64(len(rs.body)) != rs.declaredLen {
			return rs.reject(openai.BadRequest("", "The request body is %d bytes but its content-length says %d.",
				len(rs.body), rs.declaredLen))
		}
		return rs.decideStreamed(true)
	case filterv3.ProcessingMode_BUFFERED_PARTIAL:
		if !b.GetEndOfStream() && int64(len(rs.body)) != rs.declaredLen {
			// Envoy sent what fit in its buffer, not the whole body: we cannot route on a partial prompt. (A
			// body of its declared length without end_of_stream is whole, with trailers to follow.)
			return rs.reject(openai.BodyTooLarge(int64(len(rs.body))))
		}
	}
	return rs.decideBuffered()
}

func (rs *requestState) requestTrailers() []*extprocv3.ProcessingResponse {
	if rs.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !rs.decided {
		out := rs.decideStreamed(true)
		if rs.finished {
			return out
		}
		return append(out, &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return one(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// dropReceived returns the buffer of the message just handled to the shared pool unless the request kept it
// as its body: the answers that might point into it are sent. The message goes too: its body may lie in a
// buffer that is now the pool's.
func (rs *requestState) dropReceived() {
	if rs.in.buf != nil {
		sharedBufferPool.Put(rs.in.buf)
	}
	rs.in = pooledRequest{}
}

// send sends one answer; the one that carries a large rewritten body hands its buffer over with it.
func (rs *requestState) send(stream extprocv3.ExternalProcessor_ProcessServer, resp *extprocv3.ProcessingResponse) error {
	if rs.handOver != nil && resp == rs.handOver {
		return rs.sendHandingOver(stream)
	}
	return stream.Send(resp)
}

// sent runs once the answers to a message are sent: gRPC has marshalled them, so the buffers they pointed
// into are free.
func (rs *requestState) sent() {
	if rs.rewritten != nil {
		sharedBufferPool.Put(rs.rewritten)
		rs.rewritten = nil
	}
	if rs.decided && rs.body != nil {
		rs.releaseBody() // routed: the decision that carried it is sent, and nothing reads it again
	}
	if rs.settleDue {
		rs.settleDue = false
		rs.settle(false)
	}
}

// releaseBody lets go of the request body: a request streams its answer for as long as it takes, and the
// body it was routed on must not stay in memory all that time.
func (rs *requestState) releaseBody() {
	rs.admitted.giveBack()
	rs.admitted = nil
	if rs.held > 0 {
		rs.srv.bodies.give(rs.held)
		rs.srv.metrics.BodyBytesHeld.Sub(float64(rs.held))
		rs.held = 0
	}
	rs.body = nil
	if rs.pooledBody != nil {
		sharedBufferPool.Put(rs.pooledBody)
		rs.pooledBody = nil
	}
}

// close runs when the stream ends for any reason: a request that was routed but never saw the end of its
// response was aborted (client gone, upstream reset, Envoy timeout) and is settled now — unless its event
// stream's terminal event already passed: a client that closes its connection on `data: [DONE]`, before the
// body's last empty chunk, had the whole answer.
func (rs *requestState) close() {
	rs.sent() // a response that ended settles as it ended, even if its last answer could not be sent
	rs.settle(!(rs.sse != nil && rs.sse.Complete() && rs.upstreamStatus > 0 && rs.upstreamStatus < 400))
	rs.trace.Reject(0, "stream_ended", rs.now()) // authenticated, never answered: the stream ended under it
	rs.releaseBody()
	rs.dropReceived()
}

// admitBody waits, before the stream is read on, until the receive gate admits a large body: in BUFFERED mode
// within the time Envoy gives the body's answer, in FULL_DUPLEX_STREAMED within one message timeout; a body
// not admitted by then is refused with 503 and retry-after.
func (rs *requestState) admitBody() {
	n := rs.awaitBody
	rs.awaitBody = 0
	// The admission lapses a message timeout after the longest wait: by then Envoy has the whole body of any
	// client that is not trickling it.
	timeout := rs.snap.Admission().BufferedMessageTimeout
	wait := rs.maxQueueWait()
	if wait <= 0 {
		wait = timeout
	}
	lapse := wait + timeout
	if rs.admitted = rs.srv.receive.admit(rs.ctx, n, wait, lapse); rs.admitted != nil {
		return
	}
	if rs.ctx.Err() != nil {
		return // the stream ended while it waited
	}
	rs.finishing = rs.reject(openai.BodiesInFlight())[0]
}

// holdBody takes n bytes of a body that arrived from the server's body budget.
func (rs *requestState) holdBody(n int64) bool {
	if n == 0 {
		return true
	}
	if !rs.srv.bodies.take(n, rs.held+n, rs.snap.Gateway().MaxBodyBytesInFlight) {
		return false
	}
	rs.held += n
	rs.srv.metrics.BodyBytesHeld.Add(float64(n))
	return true
}

// appendBody collects a body that arrives in frames in buffers from the shared pool: memory follows the
// bytes that really arrived (at most twice them, one power-of-two tier), never a declared length, and a
// finished request's buffer serves the next one.
func (rs *requestState) appendBody(chunk []byte) {
	if need := len(rs.body) + len(chunk); need > cap(rs.body) {
		size := max(need, 2*len(rs.body))
		if rs.admitted != nil && rs.declaredLen > int64(size) {
			size = int(rs.declaredLen) // admitted: room for the whole body at once, not grown by copies
		}
		nb := sharedBufferPool.Get(size)
		grown := (*nb)[:len(rs.body)]
		copy(grown, rs.body)
		if rs.pooledBody != nil {
			sharedBufferPool.Put(rs.pooledBody)
		}
		rs.pooledBody, rs.body = nb, grown
	}
	rs.body = append(rs.body, chunk...)
}
