package extproc

import (
	"context"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/netturn"
	"github.com/infergate/infergate/openai"
)

// fallbackLeg reports the model and fallback an upstream ext_proc stream is for ("" when the stream is the
// downstream filter's, the ordinary request path).
func fallbackLeg(ctx context.Context) (model, fallback string) {
	// ValueFromIncomingContext reads one key without copying the whole metadata, as FromIncomingContext does:
	// every stream asks, and nearly none is a fallback leg.
	get := func(k string) string {
		if v := metadata.ValueFromIncomingContext(ctx, k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	return get(contract.LegModelMetadata), get(contract.LegFallbackMetadata)
}

// edgeRegion is the region an Envoy names on its ext_proc stream (contract.EdgeRegionMetadata), "" when none.
func edgeRegion(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, contract.EdgeRegionMetadata); len(v) == 1 {
		return v[0]
	}
	return ""
}

// processFallbackLeg serves the upstream ext_proc stream of one attempt to a managed-API cluster. When Envoy
// retries a request the pool failed onto the managed API, the body still names the model as the pool serves
// it, and Envoy does not run the downstream ext_proc again; this stream renames it to the provider's model.
// Nothing else happens here: the downstream stream already authenticated, charged and routed the request, and
// settles it from the response it sees. A body that already names the provider's model (overflow that the
// downstream ext_proc sent to the managed API itself) passes unchanged; so does any body when the policy no
// longer lists the fallback (the provider's error then reaches the client).
func (s *Server) processFallbackLeg(stream extprocv3.ExternalProcessor_ProcessServer, modelName, fallbackName string) error {
	var providerModel string
	if m, ok := s.opts.Policies.Current().Model(modelName); ok {
		for i := range m.Fallbacks {
			if m.Fallbacks[i].Name == fallbackName {
				providerModel = m.Fallbacks[i].Model
			}
		}
	}
	if providerModel == "" {
		s.opts.Logger.Warn("upstream ext_proc for a fallback the policy does not list; body passes unchanged",
			"model", modelName, "fallback", fallbackName)
	}
	var path string
	var body []byte
	limit, tooBig := s.opts.Policies.Current().Gateway().MaxRequestBodyBytes, false
	for {
		msg, err := stream.Recv()
		if err != nil {
			return endOfStream(err)
		}
		var out *extprocv3.ProcessingResponse
		switch r := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, hv := range r.RequestHeaders.GetHeaders().GetHeaders() {
				if hv.GetKey() == ":path" {
					path = headerValue(hv)
				}
			}
			out = headersResponse(nil, false, nil)
		case *extprocv3.ProcessingRequest_RequestBody:
			// The downstream stream already refused bodies over the limit; a larger one here is not held.
			if chunk := r.RequestBody.GetBody(); !tooBig && int64(len(body)+len(chunk)) <= limit {
				body = append(body, chunk...)
			} else {
				tooBig, body = true, nil
			}
			cr := &extprocv3.CommonResponse{}
			if r.RequestBody.GetEndOfStream() && providerModel != "" && !tooBig {
				if renamed, ok := renameModel(openai.EndpointForPath(path), body, providerModel); ok {
					cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
						setHeader("content-length", strconv.Itoa(len(renamed)))}}
					cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: renamed}}
				}
			}
			out = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			out = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = responseHeadersResponse(nil)
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			out = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
		default:
			continue
		}
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// renameModel returns body with its model replaced, or false when the body is not a request it can parse or
// already names that model.
func renameModel(ep openai.Endpoint, body []byte, model string) ([]byte, bool) {
	req, err := openai.ParseRequestYielding(ep, body, netturn.Yield)
	if err != nil {
		return nil, false
	}
	defer req.Release()
	if req.Model == model {
		return nil, false
	}
	return req.RewriteYielding(make([]byte, 0, len(body)+len(model)), openai.Edits{Model: model}, netturn.Yield), true
}
