package extproc

import (
	"strconv"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// A routed request's two busiest answers — the routing decision and the response headers' — are built in
// storage its request state owns instead of a dozen small allocations each. Process sends every answer before
// it reads the next message, and gRPC has marshalled a message before Send returns, so nothing reads an
// answer's storage after it was sent (but a large rewritten body, which gRPC sends from its own buffer and
// frees once written: handedOverBody); each answer has storage of its own, so none is overwritten while a
// caller still holds it either. The types hold protobuf messages by value: never copy them.

// headerSlots is how many header mutations an answer sets without allocating: a decision sets at most model,
// pool, destination, prefiller, tenant, request id, traceparent, tracestate and content-length; response headers
// the scores, six rate-limit headers and the request id.
const headerSlots = 9

// headerSet builds one answer's header mutations.
type headerSet struct {
	opts [headerSlots]corev3.HeaderValueOption
	vals [headerSlots]corev3.HeaderValue
	ptrs [headerSlots]*corev3.HeaderValueOption
	list []*corev3.HeaderValueOption
	// raw holds the values' bytes; values past its room go to a grown copy, and earlier values keep theirs.
	raw    []byte
	rawArr [256]byte
}

// set overwrites a header, as setHeader does.
func (s *headerSet) set(key, value string) {
	start := s.begin()
	s.raw = append(s.raw, value...)
	s.finish(key, start)
}

// setInt overwrites a header with a decimal number, formatted in place.
func (s *headerSet) setInt(key string, v int64) {
	start := s.begin()
	s.raw = strconv.AppendInt(s.raw, v, 10)
	s.finish(key, start)
}

func (s *headerSet) begin() int {
	if s.list == nil {
		s.list, s.raw = s.ptrs[:0], s.rawArr[:0]
	}
	return len(s.raw)
}

// finish adds the header whose value set or setInt appended to raw from start.
func (s *headerSet) finish(key string, start int) {
	value := s.raw[start:len(s.raw):len(s.raw)]
	n := len(s.list)
	if n >= headerSlots {
		s.list = append(s.list, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: value}})
		return
	}
	v, o := &s.vals[n], &s.opts[n]
	v.Key, v.RawValue = key, value
	o.Header = v
	s.list = append(s.list, o)
}

// headers is what set built, in order.
func (s *headerSet) headers() []*corev3.HeaderValueOption { return s.list }

// decisionAnswer is the routing decision's answer: the request body's in BUFFERED mode, the deferred request
// headers' and the first body frame in FULL_DUPLEX_STREAMED mode.
type decisionAnswer struct {
	set      headerSet
	mutation extprocv3.HeaderMutation
	common   extprocv3.CommonResponse
	resp     extprocv3.ProcessingResponse
	headers  extprocv3.HeadersResponse
	asHdrs   extprocv3.ProcessingResponse_RequestHeaders
	body     extprocv3.BodyResponse
	asBody   extprocv3.ProcessingResponse_RequestBody
	bodyMut  extprocv3.BodyMutation
	whole    extprocv3.BodyMutation_Body
	out      [2]*extprocv3.ProcessingResponse
	// The first streamed body frame.
	frame       extprocv3.ProcessingResponse
	frameAsBody extprocv3.ProcessingResponse_RequestBody
	frameBody   extprocv3.BodyResponse
	frameCommon extprocv3.CommonResponse
	frameMut    extprocv3.BodyMutation
	frameStream extprocv3.BodyMutation_StreamedResponse
	frameData   extprocv3.StreamedBodyResponse
}

// requestHeadersAnswer is the answer to the request headers in BUFFERED mode: strip the key and the forged
// routing headers; the decision follows with the body.
type requestHeadersAnswer struct {
	mutation extprocv3.HeaderMutation
	common   extprocv3.CommonResponse
	headers  extprocv3.HeadersResponse
	asHdrs   extprocv3.ProcessingResponse_RequestHeaders
	resp     extprocv3.ProcessingResponse
	out      [1]*extprocv3.ProcessingResponse
}

// build fills the answer.
func (a *requestHeadersAnswer) build(remove []string) []*extprocv3.ProcessingResponse {
	a.mutation.RemoveHeaders = remove
	a.common.HeaderMutation = &a.mutation
	a.headers.Response = &a.common
	a.asHdrs.RequestHeaders = &a.headers
	a.resp.Response = &a.asHdrs
	a.out[0] = &a.resp
	return a.out[:]
}

// responseHeadersAnswer is the answer to the response headers.
type responseHeadersAnswer struct {
	set      headerSet
	mutation extprocv3.HeaderMutation
	common   extprocv3.CommonResponse
	headers  extprocv3.HeadersResponse
	asHdrs   extprocv3.ProcessingResponse_ResponseHeaders
	resp     extprocv3.ProcessingResponse
}

// lbMetadataCacheSize bounds the cache of envoy.lb metadata: destination lists repeat (a fleet has few
// endpoints), so nearly every decision finds its list's metadata built.
const lbMetadataCacheSize = 4096

var (
	lbMetadataCache sync.Map // destination list → *structpb.Struct, read-only once stored
	lbMetadataCount atomic.Int64
)

// cachedLBMetadata is lbMetadata(endpoints), built once per destination list. A message that is only read may
// be marshalled by many streams at once.
func cachedLBMetadata(endpoints string) *structpb.Struct {
	if md, ok := lbMetadataCache.Load(endpoints); ok {
		return md.(*structpb.Struct)
	}
	md := lbMetadata(endpoints)
	if lbMetadataCount.Add(1) > lbMetadataCacheSize {
		lbMetadataCache.Clear()
		lbMetadataCount.Store(1)
	}
	lbMetadataCache.Store(endpoints, md)
	return md
}
