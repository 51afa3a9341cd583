package extproc

import (
	"encoding/json"
	"slices"
	"time"
	"unsafe"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/contract"
)

type structpbStruct = structpb.Struct

func one(r *extprocv3.ProcessingResponse) []*extprocv3.ProcessingResponse {
	return []*extprocv3.ProcessingResponse{r}
}

// headerValue reads a header as Envoy sends it: raw_value by default, value when the runtime guard is off. The
// string shares raw_value's bytes, which protobuf decoding copied out of gRPC's buffer into the message, and
// which no one writes to: it costs no copy, and keeps the request's header message alive as long as it lives.
func headerValue(h *corev3.HeaderValue) string {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return unsafe.String(&raw[0], len(raw))
	}
	return h.GetValue()
}

// setHeader overwrites a header. The value goes in raw_value: Envoy ignores value when raw_value is in use,
// and the default (no append) replaces any copy the client sent.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}}
}

func headersResponse(hm *extprocv3.HeaderMutation, clearRoute bool, md *structpb.Struct) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: hm, ClearRouteCache: clearRoute},
		}},
		DynamicMetadata: md,
	}
}

// responseHeadersResponse answers response headers.
func responseHeadersResponse(hm *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: hm},
		}},
	}
}

// streamedBody splits body into FULL_DUPLEX_STREAMED chunks; the last carries endOfStream. An empty body still
// produces one message so Envoy learns the end of stream.
func streamedBody(body []byte, endOfStream, request bool) []*extprocv3.ProcessingResponse {
	n := (len(body) + streamChunkBytes - 1) / streamChunkBytes
	if n == 0 {
		n = 1
	}
	out := make([]*extprocv3.ProcessingResponse, 0, n)
	for i := 0; i < n; i++ {
		lo, hi := i*streamChunkBytes, min((i+1)*streamChunkBytes, len(body))
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: body[lo:hi], EndOfStream: endOfStream && i == n-1,
			}},
		}}}
		if request {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}})
		} else {
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}})
		}
	}
	return out
}

// immediate ends the request with a local reply from Envoy.
func immediate(code int, body []byte, requestID, details string, extra map[string]string) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if requestID != "" {
		set = append(set, setHeader(contract.HeaderRequestID, requestID))
	}
	// A default retry-after for overload answers, unless the error says when — or says not to retry.
	if _, ok := extra["retry-after"]; !ok && (code == 429 || code == 503) && extra["x-should-retry"] != "false" {
		set = append(set, setHeader("retry-after", "1"))
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		set = append(set, setHeader(k, extra[k]))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: details,
		},
	}}
}

// lbMetadata is the envoy.lb dynamic metadata that override_host reads the destination list from.
func lbMetadata(endpoints string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		contract.MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			contract.HeaderDestination: structpb.NewStringValue(endpoints),
		}}),
	}}
}

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelList renders GET /v1/models for a tenant: the canonical models it may call.
// modelObject renders GET /v1/models/{id}: the model under the name the client asked by.
func modelObject(id string, loaded time.Time) []byte {
	b, _ := json.Marshal(modelEntry{ID: id, Object: "model", Created: loaded.Unix(), OwnedBy: "infergate"})
	return b
}

func modelList(names []string, loaded time.Time) []byte {
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: make([]modelEntry, 0, len(names))}
	for _, name := range names {
		out.Data = append(out.Data, modelEntry{ID: name, Object: "model", Created: loaded.Unix(), OwnedBy: "infergate"})
	}
	b, _ := json.Marshal(out) // plain strings and numbers: cannot fail
	return b
}
