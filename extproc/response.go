package extproc

import (
	"strconv"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/telemetry"
)

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

func (rs *requestState) responseHeaders(h *extprocv3.HttpHeaders) []*extprocv3.ProcessingResponse {
	hasRequestID := false
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":status":
			rs.upstreamStatus, _ = strconv.Atoi(headerValue(hv))
		case contract.HeaderRequestID:
			hasRequestID = true
		}
	}
	a := &rs.respAnswer
	rename := rs.decided && rs.route.RenameModel != nil && rs.respMode != filterv3.ProcessingMode_NONE
	if rs.decided && rs.stream {
		injected := rs.route.Edits.IncludeUsage
		rs.sse = &openai.SSEScanner{DropUsageChunk: injected}
		if rename {
			rs.sse.RenameModel = rs.route.RenameModel
		}
		rs.startOutputDigest()
		rs.startAnswerCapture()
	} else if rename {
		rs.rename = &openai.ModelRenamer{Name: rs.route.RenameModel}
	}
	if rs.decided && (rs.route.Edits.IncludeUsage && rs.stream || rename) {
		// We may shorten the stream by the usage event we asked for, or change the model's name.
		a.mutation.RemoveHeaders = contentLength
	}
	if rs.decided {
		if len(rs.route.Decision.Scores) > 0 {
			a.set.set(contract.HeaderScores, formatScores(rs.route.Decision.Scores))
		}
		rateLimitHeaders(&a.set, rs.route.Budgets())
		if !hasRequestID {
			// OpenAI answers every response with its request id, and the SDKs expose it (_request_id): the
			// one infergate logged and settled under.
			a.set.set(contract.HeaderRequestID, rs.requestID)
		}
	}
	a.mutation.SetHeaders = a.set.headers()
	if a.mutation.SetHeaders != nil || a.mutation.RemoveHeaders != nil {
		a.common.HeaderMutation = &a.mutation
	}
	a.headers.Response = &a.common
	a.asHdrs.ResponseHeaders = &a.headers
	a.resp.Response = &a.asHdrs
	resp := &a.resp
	if h.GetEndOfStream() || rs.respMode == filterv3.ProcessingMode_NONE {
		if !h.GetEndOfStream() && rs.decided {
			rs.noteContent() // the body is not seen: its headers are the nearest thing to a first token
		}
		rs.settleOnceSent()
	}
	return one(resp)
}

// contentLength is the removal list of a response whose length the gateway may change; it is only read.
var contentLength = []string{"content-length"}

func (rs *requestState) responseBody(b *extprocv3.HttpBody) []*extprocv3.ProcessingResponse {
	chunk, end := b.GetBody(), b.GetEndOfStream()
	out := chunk
	if rs.sse != nil {
		before := rs.sse.ContentEvents()
		out = rs.sse.Process(chunk, end)
		if rs.sse.ContentEvents() > before {
			rs.noteContent()
		}
	} else if rs.decided && len(chunk) > 0 {
		rs.noteContent()
	}
	if rs.sse == nil && rs.decided && !rs.respTooBig {
		if len(rs.respBody)+len(chunk) > maxResponseBodyBytes {
			rs.respTooBig, rs.respBody = true, nil
		} else {
			rs.respBody = append(rs.respBody, chunk...)
		}
	}
	if rs.rename != nil {
		out = rs.rename.Process(chunk)
	}
	if end {
		rs.settleOnceSent()
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
		if !sameBytes(out, chunk) {
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
	rs.settleOnceSent()
	return append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
		ResponseTrailers: &extprocv3.TrailersResponse{}}})
}

// settleOnceSent settles a response that has ended once the answer to its last message is sent (sent): Envoy
// holds the response (its headers, or its last chunk) until that answer, and settling — usage, quotas, the
// picker's learning, telemetry, the audit log's digests — need not be in its way. Outside Process (tests that
// drive handle directly) it settles at once.
func (rs *requestState) settleOnceSent() {
	if !rs.decided || rs.route == nil || rs.route.Settled() || rs.settleDue {
		return
	}
	if !rs.deferSettle {
		rs.settle(false)
		return
	}
	rs.settleDue, rs.endedAt = true, rs.now()
}

// settle hands the response's outcome to the director, which accounts for the request once.
func (rs *requestState) settle(aborted bool) {
	if !rs.decided || rs.route == nil || rs.route.Settled() { // the director settles once; it keeps the flag
		return
	}
	o := rs.outcome(aborted)
	o.TraceID = rs.trace.TraceID()
	st := rs.srv.director.Settle(rs.route, o)
	rs.trace.End(st, telemetry.Marks{Routed: rs.timing.routed, FirstToken: rs.timing.first, Ended: o.Ended})
}
