package extproc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
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
	limit     int64
	decided   bool

	// routing decision
	model    *policies.Model
	decision picker.Decision
	req      openai.Request
	injected bool // we turned on stream_options.include_usage
	// maxOut is the output bound admission reserved; injectMaxTokens is set when it was written into the body.
	maxOut, injectMaxTokens int64
	ticket                  *quota.Ticket
	conversation            string

	// response path
	upstreamStatus int
	sse            *openai.SSEScanner
	respBody       []byte
	respTooBig     bool
	respEnded      bool    // the response body's end went back to Envoy (FULL_DUPLEX_STREAMED)
	served         string  // the endpoint Envoy reports it sent the request to, when it does
	pooledBody     *[]byte // the shared-pool buffer rs.body lives in, returned at close
	settled        bool
}

func (rs *requestState) log() *slog.Logger { return rs.srv.opts.Logger }

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

// noteServed reads the endpoint Envoy reports it used, from a response-path message's metadata context.
func (rs *requestState) noteServed(msg *extprocv3.ProcessingRequest) {
	switch msg.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders, *extprocv3.ProcessingRequest_ResponseBody,
		*extprocv3.ProcessingRequest_ResponseTrailers:
	default:
		return
	}
	lb := msg.GetMetadataContext().GetFilterMetadata()[contract.MetadataNamespace]
	if v := lb.GetFields()[contract.ServedEndpointKey].GetStringValue(); v != "" && len(v) <= 256 {
		rs.served = v
	}
}

// reject ends the request with an OpenAI-shaped error.
func (rs *requestState) reject(e *openai.Error) []*extprocv3.ProcessingResponse {
	rs.finished = true
	rs.srv.opts.Metrics.Requests.WithLabelValues(e.Code).Inc()
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

func (rs *requestState) requestHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	rs.started = time.Now()
	rs.snap = rs.srv.opts.Policies.Current()
	gw := rs.snap.Gateway()
	rs.limit = gw.MaxRequestBodyBytes
	var method, path, auth, contentLength string
	convHeader := rs.snap.QuotaSettings().ConversationHeader
	for _, hv := range h.GetHeaders().GetHeaders() {
		key := strings.ToLower(hv.GetKey()) // Envoy sends lower case; be safe with other clients
		switch {
		case convHeader != "" && key == convHeader:
			rs.conversation = headerValue(hv)
		case key == ":method":
			method = headerValue(hv)
		case key == ":path":
			path = headerValue(hv)
		case key == "authorization":
			auth = headerValue(hv)
		case key == "content-length":
			contentLength = headerValue(hv)
		case key == contract.HeaderRequestID:
			// A client's id is kept only when it is a plain token: it is echoed in responses and logs, where
			// CR/LF or other control bytes would split headers and lines.
			if id := headerValue(hv); validRequestID(id) {
				rs.requestID, rs.hadReqID = id, true
			}
		case contract.Reserved(key):
			rs.strip = append(rs.strip, key)
		}
	}
	if rs.requestID == "" {
		rs.requestID, rs.hadReqID = rand.Text(), false
	}
	rs.endpoint = openai.EndpointForPath(path)
	if rs.endpoint == openai.EndpointNone {
		return rs.reject(openai.NotFound(method, path))
	}
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		key, ok = strings.CutPrefix(auth, "bearer ")
	}
	key = strings.TrimSpace(key)
	guard := rs.srv.auth
	if throttled, retry := guard.throttled(rs.source); throttled {
		return rs.reject(openai.TooManyAuthFailures(retry))
	}
	if !ok || key == "" {
		guard.failed(rs.source)
		return rs.reject(openai.InvalidAPIKey(true))
	}
	if rs.tenant, ok = rs.snap.TenantForKey(key); !ok {
		guard.failed(rs.source)
		return rs.reject(openai.InvalidAPIKey(false))
	}
	if rs.endpoint == openai.EndpointModels {
		if method != http.MethodGet {
			return rs.reject(openai.MethodNotAllowed(method, path))
		}
		rs.finished = true
		rs.srv.opts.Metrics.Requests.WithLabelValues("models_list").Inc()
		return one(immediate(http.StatusOK, modelList(rs.snap.ModelsFor(rs.tenant), rs.snap.LoadedAt), rs.requestID, "", nil))
	}
	if method != http.MethodPost {
		return rs.reject(openai.MethodNotAllowed(method, path))
	}
	if h.GetEndOfStream() {
		return rs.reject(openai.BadRequest("", "The request has no body; send a JSON object."))
	}
	rs.declaredLen = -1
	if contentLength != "" {
		n, err := strconv.ParseInt(contentLength, 10, 64)
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
		return one(headersResponse(rs.headerMutation(nil), false, nil))
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // answered once the whole body has been read
	default:
		return rs.reject(openai.Internal(
			"The gateway is misconfigured: ext_proc request body mode %s cannot carry the body to route on; use BUFFERED or FULL_DUPLEX_STREAMED.",
			rs.reqMode))
	}
}

func (rs *requestState) requestBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	if rs.decided {
		// FULL_DUPLEX_STREAMED data after the decision (only possible if Envoy sent trailers first); drop it.
		return nil
	}
	if int64(len(rs.body))+int64(len(b.GetBody())) > rs.limit {
		return rs.reject(openai.BodyTooLarge(rs.limit))
	}
	if len(rs.body) == 0 && rs.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		rs.body = b.GetBody() // the whole body in one message: use it in place
	} else {
		rs.appendBody(b.GetBody())
	}
	switch rs.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if !b.GetEndOfStream() {
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

// decide parses the body, resolves the model, checks the tenant's permission and picks the endpoints. It
// returns the body to forward (rewritten when needed) or an error to send back.
func (rs *requestState) decide() ([]byte, bool, *openai.Error) {
	req, err := openai.ParseRequest(rs.endpoint, rs.body)
	if err != nil {
		return nil, false, asOpenAIError(err)
	}
	rs.req = req
	defer rs.req.Release()
	model, ok := rs.snap.Model(req.Model)
	if !ok {
		return nil, false, openai.ModelNotFound(req.Model)
	}
	if !rs.snap.Allows(rs.tenant, model) {
		return nil, false, openai.ModelForbidden(req.Model)
	}
	rs.model = model
	if e := rs.boundOutput(); e != nil {
		return nil, false, e
	}
	if e := rs.admit(); e != nil {
		return nil, false, e
	}
	in := picker.Input{Tenant: rs.tenant, Model: model, Request: &rs.req}
	if rs.snap.Adapter(req.Model) {
		in.Adapter = req.Model
	}
	dec, err := rs.srv.opts.Picker.Pick(rs.snap, in)
	if err != nil {
		rs.releaseTicket()
		return nil, false, asOpenAIError(err)
	}
	rs.decision = dec
	body := rs.body
	served := dec.Served()
	rename := ""
	if served != req.Model {
		rename = served
	}
	rs.injected = req.Stream && !req.IncludeUsage && rs.endpoint != openai.EndpointEmbeddings
	changed := rename != "" || rs.injected || rs.injectMaxTokens > 0
	if changed {
		body = rs.req.Rewrite(make([]byte, 0, len(body)+64), openai.Edits{
			Model: rename, IncludeUsage: rs.injected, MaxTokens: rs.injectMaxTokens})
	}
	// From here on the request is routed: its reservation is settled by settle().
	rs.decided = true
	rs.srv.opts.InFlight.Start(dec.Target(model.Name))
	m := rs.srv.opts.Metrics
	m.InFlight.Inc()
	m.Requests.WithLabelValues("routed").Inc()
	m.Decision.WithLabelValues(rs.reqMode.String()).Observe(time.Since(rs.started).Seconds())
	rs.log().Debug("request routed", "request_id", rs.requestID, "tenant", rs.tenant.Name, "model", model.Name,
		"pool", rs.poolName(), "endpoints", dec.Endpoints, "stream", req.Stream)
	return body, changed, nil
}

// boundOutput fixes the most output tokens the request can produce, which admission reserves: what the
// client asked (refused when the model's context cannot hold it), or the policy's default, which is then
// written into the body so that the engine's own default cannot exceed what was charged.
func (rs *requestState) boundOutput() *openai.Error {
	rs.maxOut, rs.injectMaxTokens = rs.req.MaxTokens, 0
	if rs.endpoint == openai.EndpointEmbeddings {
		rs.maxOut = 0
		return nil
	}
	ctxTokens := rs.model.ContextTokens
	if rs.maxOut > ctxTokens {
		return openai.BadRequest("max_tokens", "max_tokens is too large: %d. This model's context is %d tokens; ask for at most that many.",
			rs.maxOut, ctxTokens)
	}
	if rs.maxOut == 0 {
		room := ctxTokens - min(int64(rs.req.EstimatePromptTokens()), ctxTokens)
		rs.maxOut = max(1, min(int64(rs.snap.Gateway().DefaultMaxTokens), room))
		rs.injectMaxTokens = rs.maxOut
	}
	return nil
}

// admit reserves the request's estimated tokens and cost against the tenant's quotas.
func (rs *requestState) admit() *openai.Error {
	q := rs.srv.opts.Quotas
	if q == nil {
		return nil
	}
	prompt := int64(rs.req.EstimatePromptTokens())
	t, rej, err := q.Admit(rs.ctx, quota.Request{Snapshot: rs.snap, Tenant: rs.tenant, Model: rs.model,
		EstimatedTokens: quota.AddTokens(prompt, rs.maxOut), EstimatedCostMicros: quota.MicroUSD(rs.model, prompt, rs.maxOut),
		Conversation: rs.conversation})
	switch {
	case errors.Is(err, quota.ErrUnavailable):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeServiceUnavailable, Code: "quota_unavailable",
			Message: "The quota service is unavailable and this gateway fails closed; please retry shortly."}
	case err != nil:
		return openai.Internal("The gateway could not check your quota.")
	case rej != nil:
		return rej.Error(rs.tenant.Name, rs.model.Name)
	}
	rs.ticket = t
	return nil
}

// releaseTicket returns a reservation for a request that will not be sent.
func (rs *requestState) releaseTicket() {
	if rs.ticket != nil {
		rs.srv.opts.Quotas.Settle(rs.ticket, 0, 0)
		rs.ticket = nil
	}
}

func asOpenAIError(err error) *openai.Error {
	if e, ok := err.(*openai.Error); ok {
		return e
	}
	return openai.Internal("The gateway failed to route the request.")
}

// decideBuffered answers the single BUFFERED body message: routing headers, metadata and the possibly
// rewritten body travel together in the body response, with clear_route_cache so Envoy re-matches the route.
func (rs *requestState) decideBuffered() []*extprocv3.ProcessingResponse {
	body, changed, e := rs.decide()
	if e != nil {
		return rs.reject(e)
	}
	hm := rs.routingMutation()
	cr := &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: true}
	if changed {
		// Envoy keeps content-length in BUFFERED mode and refuses a body whose length differs; the header
		// mutation in the same response is applied first.
		hm.SetHeaders = append(hm.SetHeaders, setHeader("content-length", strconv.Itoa(len(body))))
		cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	}
	return one(&extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}},
		DynamicMetadata: rs.metadata(),
	})
}

// decideStreamed answers FULL_DUPLEX_STREAMED once the body is complete: the deferred headers response with
// the routing decision, then the body as streamed_response chunks.
func (rs *requestState) decideStreamed(endOfStream bool) []*extprocv3.ProcessingResponse {
	body, _, e := rs.decide()
	if e != nil {
		return rs.reject(e)
	}
	hm := rs.headerMutation(rs.routingMutation().SetHeaders)
	hm.SetHeaders = append(hm.SetHeaders, setHeader("content-length", strconv.Itoa(len(body))))
	out := make([]*extprocv3.ProcessingResponse, 0, 2+len(body)/streamChunkBytes)
	out = append(out, headersResponse(hm, true, rs.metadata()))
	return append(out, streamedBody(body, endOfStream, true)...)
}

// poolName is the x-infergate-pool value: the pool, or "fallback/<name>" for a managed API (pool names
// cannot contain '/', so the two never collide).
func (rs *requestState) poolName() string {
	if f := rs.decision.Fallback; f != nil {
		return contract.FallbackPool(f.Name)
	}
	return rs.decision.Pool.Name
}

// routingMutation sets the contract headers for the decision.
func (rs *requestState) routingMutation() *extprocv3.HeaderMutation {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		setHeader(contract.HeaderModel, rs.model.Name),
		setHeader(contract.HeaderPool, rs.poolName()),
	}}
	if len(rs.decision.Endpoints) > 0 {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(contract.HeaderDestination, strings.Join(rs.decision.Endpoints, ",")))
	}
	if rs.snap.Gateway().TenantHeader {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(contract.HeaderTenant, rs.tenant.Name))
	}
	if !rs.hadReqID {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(contract.HeaderRequestID, rs.requestID))
	}
	return hm
}

// headerMutation removes forged routing headers and the client's API key, and adds set.
func (rs *requestState) headerMutation(set []*corev3.HeaderValueOption) *extprocv3.HeaderMutation {
	remove := make([]string, 0, len(rs.strip)+1)
	remove = append(remove, "authorization")
	for _, name := range rs.strip {
		if !setsHeader(set, name) {
			remove = append(remove, name)
		}
	}
	return &extprocv3.HeaderMutation{RemoveHeaders: remove, SetHeaders: set}
}

func setsHeader(set []*corev3.HeaderValueOption, name string) bool {
	for _, h := range set {
		if h.GetHeader().GetKey() == name {
			return true
		}
	}
	return false
}

func (rs *requestState) metadata() *structpbStruct {
	if len(rs.decision.Endpoints) == 0 {
		return nil
	}
	return lbMetadata(strings.Join(rs.decision.Endpoints, ","))
}

// ---- response path ----

func (rs *requestState) responseHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			rs.upstreamStatus, _ = strconv.Atoi(headerValue(hv))
		}
	}
	var hm *extprocv3.HeaderMutation
	if rs.decided && rs.req.Stream {
		rs.sse = &openai.SSEScanner{DropUsageChunk: rs.injected}
		if rs.injected {
			// We may shorten the stream by the usage event we asked for.
			hm = &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}}
		}
	}
	if rs.decided && len(rs.decision.Scores) > 0 {
		if hm == nil {
			hm = &extprocv3.HeaderMutation{}
		}
		hm.SetHeaders = append(hm.SetHeaders, setHeader(contract.HeaderScores, formatScores(rs.decision.Scores)))
	}
	resp := responseHeadersResponse(hm)
	if h.GetEndOfStream() || rs.respMode == filterv3.ProcessingMode_NONE {
		rs.settle(false)
	}
	return one(resp)
}

func (rs *requestState) responseBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	chunk, end := b.GetBody(), b.GetEndOfStream()
	out := chunk
	if rs.sse != nil {
		out = rs.sse.Process(chunk, end)
	} else if rs.decided && !rs.respTooBig {
		if len(rs.respBody)+len(chunk) > maxResponseBodyBytes {
			rs.respTooBig, rs.respBody = true, nil
		} else {
			rs.respBody = append(rs.respBody, chunk...)
		}
	}
	if end {
		rs.settle(false)
	}
	switch rs.respMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if len(out) == 0 && !end {
			return nil
		}
		rs.respEnded = rs.respEnded || end
		return streamedBody(out, end, false)
	default:
		var mut *extprocv3.BodyMutation
		if rs.sse != nil && rs.sse.DropUsageChunk && !sameBytes(out, chunk) {
			if len(out) == 0 {
				mut = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
			} else {
				mut = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
			}
		}
		return one(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: mut}}}})
	}
}

func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0] || string(a) == string(b))
}

func (rs *requestState) responseTrailers() []*extprocv3.ProcessingResponse {
	var out []*extprocv3.ProcessingResponse
	if rs.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !rs.respEnded {
		// The body ended with trailers: flush anything held back, then close the body, or Envoy never
		// finishes it.
		var rest []byte
		if rs.sse != nil {
			rest = rs.sse.Process(nil, true)
		}
		out = append(out, streamedBody(rest, true, false)...)
		rs.respEnded = true
	}
	rs.settle(false)
	return append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

// settle accounts for the request once: usage from the engine when it reported it, otherwise an estimate.
func (rs *requestState) settle(aborted bool) {
	if !rs.decided || rs.settled {
		return
	}
	rs.settled = true
	opts := rs.srv.opts
	target := rs.decision.Target(rs.model.Name)
	opts.InFlight.Done(target)
	opts.Metrics.InFlight.Dec()

	var usage openai.Usage
	var reported bool
	switch {
	case rs.sse != nil:
		usage, reported = rs.sse.Usage()
	case rs.respBody != nil:
		usage, reported = openai.UsageFromJSON(rs.respBody)
	}
	result := "completed"
	switch {
	case aborted:
		result = "aborted"
	case rs.upstreamStatus >= 400 || rs.upstreamStatus == 0:
		result = "upstream_error"
	}
	if !reported {
		reason := result
		if result == "completed" {
			reason = "no_usage_in_response"
		}
		opts.Metrics.UsageEstimated.WithLabelValues(reason).Inc()
		if result != "upstream_error" {
			// Charge the prompt we sent and, for a stream cut short, the output chunks it carried (engines send
			// about one token per chunk); a client cannot dodge output charges by disconnecting before usage.
			usage = openai.Usage{PromptTokens: int64(rs.req.EstimatePromptTokens())}
			if rs.sse != nil {
				usage.CompletionTokens = rs.sse.ContentEvents()
			}
		}
	}
	if clamped, cut := usage.Clamp(rs.model.ContextTokens); cut {
		rs.log().Warn("upstream reported more tokens than the model's context holds; charged at the context size",
			"request_id", rs.requestID, "model", rs.model.Name, "prompt_tokens", usage.PromptTokens,
			"completion_tokens", usage.CompletionTokens, "context_tokens", rs.model.ContextTokens)
		usage = clamped
	}
	pricing := rs.model.Pricing
	cost := (float64(usage.PromptTokens)*pricing.InputPerMTok + float64(usage.CompletionTokens)*pricing.OutputPerMTok) / 1e6
	tenant, model := rs.tenant.Name, rs.model.Name
	opts.Metrics.Responses.WithLabelValues(result).Inc()
	opts.Metrics.Tokens.WithLabelValues(tenant, model, "prompt").Add(float64(usage.PromptTokens))
	opts.Metrics.Tokens.WithLabelValues(tenant, model, "completion").Add(float64(usage.CompletionTokens))
	opts.Metrics.Tokens.WithLabelValues(tenant, model, "cached").Add(float64(usage.CachedTokens))
	opts.Metrics.CostUSD.WithLabelValues(tenant, model).Add(cost)
	endpoint := target
	if rs.served != "" && rs.decision.Fallback == nil {
		endpoint = rs.served
	}
	st := Settlement{
		RequestID: rs.requestID, Tenant: tenant, Model: model, Pool: rs.poolName(), Endpoint: endpoint,
		Status: rs.upstreamStatus, Result: result, Usage: usage, Reported: reported, CostUSD: cost, Started: rs.started,
	}
	rs.log().Debug("request settled", "request_id", st.RequestID, "tenant", tenant, "model", model,
		"result", result, "prompt_tokens", usage.PromptTokens, "completion_tokens", usage.CompletionTokens,
		"cached_tokens", usage.CachedTokens, "usage_reported", reported)
	if rs.ticket != nil {
		opts.Quotas.Settle(rs.ticket, usage.Total(), quota.MicroUSD(rs.model, usage.PromptTokens, usage.CompletionTokens))
	}
	if o, ok := opts.Picker.(picker.Observer); ok && reported && rs.decision.Fallback == nil {
		d := rs.decision
		d.ServedBy = rs.served
		o.Observe(d, usage)
	}
	if opts.OnSettle != nil {
		opts.OnSettle(st)
	}
}

// close runs when the stream ends for any reason: a request that was routed but never saw the end of its
// response was aborted (client gone, upstream reset, Envoy timeout) and is settled now.
func (rs *requestState) close() {
	rs.settle(true)
	if rs.pooledBody != nil {
		rs.body = nil
		sharedBufferPool.Put(rs.pooledBody)
		rs.pooledBody = nil
	}
}

// appendBody collects a body that arrives in frames in buffers from the shared pool: memory follows the
// bytes that really arrived (at most twice them, one power-of-two tier), never a declared length, and a
// finished request's buffer serves the next one.
func (rs *requestState) appendBody(chunk []byte) {
	if need := len(rs.body) + len(chunk); need > cap(rs.body) {
		nb := sharedBufferPool.Get(max(need, 2*len(rs.body)))
		grown := (*nb)[:len(rs.body)]
		copy(grown, rs.body)
		if rs.pooledBody != nil {
			sharedBufferPool.Put(rs.pooledBody)
		}
		rs.pooledBody, rs.body = nb, grown
	}
	rs.body = append(rs.body, chunk...)
}

func formatScores(scores []picker.Score) string {
	var b strings.Builder
	for i, s := range scores {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s;total=%.3f;prefix=%.3f;load=%.3f;prefill=%.3f;lora=%.0f", s.Endpoint, s.Total, s.Prefix, s.Load, s.Prefill, s.LoRA)
	}
	return b.String()
}
