package extproc

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

// decide parses the body and has the director route it. It returns the body to forward (rewritten when
// needed) or an error to send back.
func (rs *requestState) decide() ([]byte, bool, *openai.Error) {
	growStack() // a decision's stack in one step: stack.go
	var err error
	// The parsed body lives in the request state, which is on the heap already: a local would escape to it
	// through the director and cost an allocation per request.
	rs.parsed, err = openai.ParseRequestYielding(rs.endpoint, rs.body, netturn.Yield)
	if err != nil {
		return nil, false, clientError(err)
	}
	req := &rs.parsed
	defer req.Release()
	rs.digestPrompt(req.Prompt)
	rt := &rs.routed
	err = rs.srv.director.Route(rs.ctx, director.Request{Snapshot: rs.snap, Tenant: rs.tenant, Endpoint: rs.endpoint,
		Body: req, Conversation: rs.conversation, RequestID: rs.requestID, Started: rs.started,
		BodyBytes: int64(len(rs.body)), MaxQueueWait: rs.maxQueueWait(), RolloutArm: rs.rolloutArm,
		EdgeRegion: rs.edgeRegionOf()}, rt)
	if err != nil {
		return nil, false, clientError(err)
	}
	rs.route, rs.stream = rt, req.Stream
	rs.destination = strings.Join(rt.Decision.Endpoints, ",")
	body, changed := rs.body, rt.Edits != (openai.Edits{})
	if changed {
		// In a pooled buffer, back in the pool once the answer carrying it is sent (sent), or handed to gRPC
		// with it (sendHandingOver). Room for every edit, so that the rewrite never grows it by a copy.
		rs.rewritten = sharedBufferPool.Get(len(body) + len(rt.Edits.Model) + 128)
		body = req.RewriteYielding((*rs.rewritten)[:0], rt.Edits, netturn.Yield)
	}
	// From here on the request is routed: the director settles it when the stream ends.
	rs.decided = true
	m := rs.srv.metrics
	m.Requests.WithLabelValues("routed").Inc()
	rs.timing.routed = rs.now()
	m.Decision.WithLabelValues(rs.reqMode.String()).Observe(rs.timing.routed.Sub(rs.started).Seconds())
	if rs.log().Enabled(rs.ctx, slog.LevelDebug) { // the arguments cost allocations even when discarded
		rs.log().Debug("request routed", "request_id", rs.requestID, "tenant", rs.tenant.Name, "model", rt.Model.Name,
			"pool", rt.Pool(), "endpoints", rt.Decision.Endpoints, "stream", req.Stream)
	}
	return body, changed, nil
}

// decideBuffered answers the single BUFFERED body message: routing headers, metadata and the possibly
// rewritten body travel together in the body response, with clear_route_cache so Envoy re-matches the route.
func (rs *requestState) decideBuffered() []*extprocv3.ProcessingResponse {
	body, changed, e := rs.decide()
	if e != nil {
		return rs.reject(e)
	}
	a := &rs.decision
	rs.routingHeaders(&a.set)
	if changed {
		// Envoy keeps content-length in BUFFERED mode and refuses a body whose length differs; the header
		// mutation in the same response is applied first.
		a.set.setInt("content-length", int64(len(body)))
		a.whole.Body = body
		a.bodyMut.Mutation = &a.whole
		a.common.BodyMutation = &a.bodyMut
		if len(body) > largeBodyBytes && rs.rewritten != nil && &body[0] == &(*rs.rewritten)[:1][0] {
			rs.handOver = &a.resp // sent without another copy: sendHandingOver
		}
	}
	a.mutation.SetHeaders = a.set.headers()
	a.common.HeaderMutation, a.common.ClearRouteCache = &a.mutation, true
	a.body.Response = &a.common
	a.asBody.RequestBody = &a.body
	a.resp.Response, a.resp.DynamicMetadata = &a.asBody, rs.metadata()
	a.out[0] = &a.resp
	return a.out[:1]
}

// decideStreamed answers FULL_DUPLEX_STREAMED once the body is complete: the deferred headers response with
// the routing decision, then the body as streamed_response chunks.
func (rs *requestState) decideStreamed(endOfStream bool) []*extprocv3.ProcessingResponse {
	body, _, e := rs.decide()
	if e != nil {
		return rs.reject(e)
	}
	a := &rs.decision
	rs.routingHeaders(&a.set)
	a.set.setInt("content-length", int64(len(body)))
	a.mutation.SetHeaders = a.set.headers()
	a.mutation.RemoveHeaders = rs.removals(a.mutation.SetHeaders)
	a.common.HeaderMutation, a.common.ClearRouteCache = &a.mutation, true
	a.headers.Response = &a.common
	a.asHdrs.RequestHeaders = &a.headers
	a.resp.Response, a.resp.DynamicMetadata = &a.asHdrs, rs.metadata()
	if len(body) > streamChunkBytes {
		out := make([]*extprocv3.ProcessingResponse, 0, 2+len(body)/streamChunkBytes)
		out = append(out, &a.resp)
		return append(out, streamedBody(body, endOfStream, true)...)
	}
	a.frameData.Body, a.frameData.EndOfStream = body, endOfStream
	a.frameStream.StreamedResponse = &a.frameData
	a.frameMut.Mutation = &a.frameStream
	a.frameCommon.BodyMutation = &a.frameMut
	a.frameBody.Response = &a.frameCommon
	a.frameAsBody.RequestBody = &a.frameBody
	a.frame.Response = &a.frameAsBody
	a.out[0], a.out[1] = &a.resp, &a.frame
	return a.out[:2]
}

// routingHeaders sets the contract headers for the decision.
func (rs *requestState) routingHeaders(s *headerSet) {
	s.set(contract.HeaderModel, rs.route.Model.Name)
	s.set(contract.HeaderPool, rs.route.Pool())
	if rs.destination != "" {
		s.set(contract.HeaderDestination, rs.destination)
	}
	if pf := rs.route.Decision.Prefill; pf != "" {
		s.set(contract.HeaderPrefiller, pf) // a split request: the decode pod's sidecar prefills there first
	}
	if rs.snap.Gateway().TenantHeader {
		s.set(contract.HeaderTenant, rs.tenant.Name)
	}
	if r := rs.snap.ResidencyKey(rs.tenant); r != "" {
		s.set(contract.HeaderResidency, r) // its pool's route fails over only inside the residency
	}
	if !rs.hadReqID {
		s.set(contract.HeaderRequestID, rs.requestID)
	}
	if tp, ts := rs.trace.Upstream(); tp != "" {
		// The engine's spans (vLLM --otlp-traces-endpoint) become children of the gateway's.
		s.set("traceparent", tp)
		if ts != "" {
			s.set("tracestate", ts)
		}
	}
}

// onlyAuthorization is the removal list of a request that forged no contract header; it is only read.
var onlyAuthorization = []string{"authorization"}

// removals are the headers to remove: the client's API key, and the routing headers it forged that set does
// not overwrite.
func (rs *requestState) removals(set []*corev3.HeaderValueOption) []string {
	if len(rs.strip) == 0 {
		return onlyAuthorization
	}
	remove := make([]string, 0, len(rs.strip)+1)
	remove = append(remove, "authorization")
	for _, name := range rs.strip {
		if !setsHeader(set, name) {
			remove = append(remove, name)
		}
	}
	return remove
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
	if rs.destination == "" {
		return nil
	}
	return cachedLBMetadata(rs.destination)
}

func formatScores(scores []picker.Score) string {
	var b strings.Builder
	for i, s := range scores {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s;total=%.3f", s.Endpoint, s.Total)
		for _, p := range s.Parts { // one per scorer of the picker's table, in its order
			fmt.Fprintf(&b, ";%s=%.3f", p.Scorer, p.Value)
		}
		if s.TTFT > 0 || s.CostUSD > 0 {
			fmt.Fprintf(&b, ";ttft_ms=%.1f;tpot_ms=%.1f;cost_usd=%.3g;meets_slo=%t", float64(s.TTFT)/1e6, float64(s.TPOT)/1e6, s.CostUSD, s.MeetsSLO)
		}
		if s.GroupCostUSD > 0 { // a prompt that starts a group: its follow-ups' TTFT and the group's cost
			fmt.Fprintf(&b, ";follow_ttft_ms=%.1f;group_cost_usd=%.3g", float64(s.FollowUpTTFT)/1e6, s.GroupCostUSD)
		}
	}
	return b.String()
}

// maxQueueWait is the longest the routing answer may be held while the request waits for room: unbounded in
// FULL_DUPLEX_STREAMED, where Envoy arms no message timeout; otherwise Envoy's message timeout as the policy
// states it, less a margin, so that the request is degraded or shed before Envoy answers 504.
func (rs *requestState) maxQueueWait() time.Duration {
	if rs.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return 0
	}
	return rs.snap.Admission().BufferedMessageTimeout - policies.BufferedWaitMargin
}

// edgeRegionOf is the region the request is placed from: the Envoy's, when it names a region of the policy
// other than this gateway's; "" (this gateway's own) otherwise. An unknown name is logged and ignored: the
// metadata comes from Envoy's configuration, never from a client, so it is a mistake to fix, not an attack.
func (rs *requestState) edgeRegionOf() string {
	r := rs.edgeRegion
	if r == "" || !rs.snap.Regional() {
		return ""
	}
	if rs.snap.RegionOrder(r) == nil {
		if !rs.srv.unknownEdge.Swap(true) {
			rs.srv.opts.Logger.Warn("an Envoy names a region the policy does not have; its requests are placed from this gateway's (logged once)",
				"edge_region", r)
		}
		return ""
	}
	return r
}

// sendHandingOver sends the BUFFERED decision whose rewritten body lies in the shared-pool buffer rewritten,
// and hands the buffer to gRPC with it (handedOverBody): the body goes out from it without another copy, and gRPC
// puts it back in the pool once written.
func (rs *requestState) sendHandingOver(stream grpc.ServerStream) error {
	buf, resp := rs.rewritten, rs.handOver
	rs.rewritten, rs.handOver = nil, nil
	*buf = rs.decision.whole.Body
	err := stream.SendMsg(handedOverBody{resp: resp, body: mem.NewBuffer(buf, sharedBufferPool)})
	rs.decision.whole.Body = nil // gRPC's now: back in the pool, and another request's, once written
	return err
}
