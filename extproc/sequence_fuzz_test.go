package extproc

import (
	"context"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// FuzzMessageSequence plays any sequence of ext_proc messages, in any order and any body modes, against the
// request state machine — what a buggy or hostile ext_proc client could send. It must never panic, and once
// the stream ends every request it routed is settled exactly once (in-flight back to zero).
func FuzzMessageSequence(f *testing.F) {
	f.Add([]byte{0, 1, 4, 5}, []byte(chatBody), []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n"), uint8(1), uint8(1), "Bearer "+keyAcme)
	f.Add([]byte{0, 1, 1, 2, 3, 4, 5, 5, 6}, []byte(`{"model":"llama-70b","messages":[{"role":"user","content":"x"}],"stream":true}`), []byte("data: [DONE]\n\n"), uint8(2), uint8(2), "Bearer "+keyAcme)
	f.Add([]byte{4, 5, 0, 1}, []byte(`{"model":`), []byte(`{"usage":{"prompt_tokens":-5}}`), uint8(0), uint8(3), "Bearer sk-nope")
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	inflight := &fleet.InFlight{}
	srv := newServer(policies.NewStaticStore(snap), config{Director: director.Options{InFlight: inflight}})
	modes := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_BUFFERED,
		filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED_PARTIAL, filterv3.ProcessingMode_STREAMED}
	f.Fuzz(func(t *testing.T, ops, reqData, respData []byte, reqMode, respMode uint8, auth string) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		rs := &requestState{srv: srv, ctx: context.Background()}
		for i, op := range ops {
			var m *extprocv3.ProcessingRequest
			half := len(reqData) / 2
			switch op % 8 {
			case 0:
				m = reqHeaders(op&8 != 0, ":method", "POST", ":path", "/v1/chat/completions", "authorization", auth,
					"content-length", string(rune('0'+op%10)), "x-request-id", auth, "x-gateway-destination-endpoint", "1.2.3.4:5")
			case 1:
				m = reqBody(reqData[:half], false)
			case 2:
				m = reqBody(reqData[half:], true)
			case 3:
				m = reqTrailers()
			case 4:
				m = respHeaders(string(auth[:min(3, len(auth))]), op&8 != 0)
			case 5:
				m = respBody(respData, op&8 != 0)
			case 6:
				m = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
					ResponseTrailers: &extprocv3.HttpTrailers{}}}
			case 7:
				m = respHeaders("200", false)
				m.MetadataContext = nil
				m.Attributes = map[string]*structpb.Struct{contract.AttributesKey: {Fields: map[string]*structpb.Value{
					"source.address": structpb.NewStringValue(auth)}}}
			}
			if i == 0 {
				m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(reqMode)%len(modes)],
					ResponseBodyMode: modes[int(respMode)%len(modes)]}
			}
			for _, r := range rs.handle(m) {
				if r == nil {
					t.Fatal("nil response")
				}
			}
			if rs.finished {
				break
			}
		}
		rs.close()
		if n := inflight.Total(); n != 0 {
			t.Fatalf("%d requests still in flight after the stream ended", n)
		}
	})
}
