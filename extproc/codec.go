package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/infergate/infergate/netturn"
)

// bodyCodec is grpc-go's proto codec, except for a ProcessingRequest that carries a large body. A BUFFERED body
// arrives as one gRPC message in frames, which grpc-go's codec copies into one buffer and proto.Unmarshal then
// copies again: about a millisecond per 4 MiB in which no other request gets the processor (RELIABILITY.md,
// "Hostile bodies"). Here the frames are gathered once, giving way every gatherSliceBytes (netturn), and the
// body is used where it lies in the gathered buffer (pooledRequest); a large rewritten body goes back from its
// own buffer too (handedOverBody).
type bodyCodec struct {
	encoding.CodecV2
	yield func() // between slices of a large body's copies: netturn.Yield
}

// newBodyCodec wraps grpc-go's registered proto codec, whose name ("proto") clients ask for.
func newBodyCodec() bodyCodec { return bodyCodec{encoding.GetCodecV2(grpcproto.Name), netturn.Yield} }

// Unmarshal decodes a received message.
func (c bodyCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *pooledRequest:
		m.req = &extprocv3.ProcessingRequest{} // as grpc-go's Recv allocates each message
		if data.Len() > largeBodyBytes {
			return m.unmarshal(data, c.yield)
		}
		v = m.req
	case *extprocv3.ProcessingRequest:
		if data.Len() > largeBodyBytes {
			// The garbage collector's buffer: the body aliases it for as long as anything reads it.
			_, err := unmarshalRequest(gather(make([]byte, 0, data.Len()), data, c.yield), m)
			return err
		}
	}
	return c.CodecV2.Unmarshal(data, v)
}

// pooledRequest receives a ProcessingRequest (req, which the codec allocates) whose large body the codec
// gathers into a buffer of the shared pool, which the receiver must return (buf; nil when the body is not in
// one) once nothing reads the body: a pooled buffer up to 16 MiB is neither zeroed (about 0.2 ms per 4 MiB, in
// one slice) nor left to the collector. Like a body gathered from frames (appendBody), it may be up to twice
// the body's size, one power-of-two tier.
type pooledRequest struct {
	req *extprocv3.ProcessingRequest
	buf *[]byte
}

// unmarshal gathers a large message into a pool buffer and decodes it, keeping the buffer for a request body.
func (p *pooledRequest) unmarshal(data mem.BufferSlice, yield func()) error {
	buf := sharedBufferPool.Get(data.Len())
	*buf = gather((*buf)[:0], data, yield)
	aliased, err := unmarshalRequest(*buf, p.req)
	if aliased && p.req.GetRequestBody() != nil {
		p.buf = buf
		return nil
	}
	// Only a request body's buffer is handed over; the response path holds its bodies by other rules.
	if hb := p.req.GetResponseBody(); aliased && hb != nil {
		hb.Body = gather(make([]byte, 0, len(hb.Body)), mem.BufferSlice{mem.SliceBuffer(hb.Body)}, yield)
	}
	sharedBufferPool.Put(buf)
	return err
}

// gatherSliceBytes is how much gather copies between two yields: some tens of microseconds.
const gatherSliceBytes = 256 << 10

// gather appends a message's frames to out, which has room for them, calling yield between slices of
// gatherSliceBytes.
func gather(out []byte, data mem.BufferSlice, yield func()) []byte {
	since := 0
	for _, b := range data {
		for chunk := b.ReadOnlyData(); len(chunk) > 0; {
			n := min(len(chunk), gatherSliceBytes-since)
			out = append(out, chunk[:n]...)
			chunk, since = chunk[n:], since+n
			if since == gatherSliceBytes {
				yield()
				since = 0
			}
		}
	}
	return out
}

// The field numbers unmarshalRequest needs, from the generated descriptors.
var (
	requestDesc     = (&extprocv3.ProcessingRequest{}).ProtoReflect().Descriptor()
	requestOneof    = requestDesc.Oneofs().ByName("request")
	requestBodyNum  = requestDesc.Fields().ByName("request_body").Number()
	responseBodyNum = requestDesc.Fields().ByName("response_body").Number()
	httpBodyBodyNum = (&extprocv3.HttpBody{}).ProtoReflect().Descriptor().Fields().ByName("body").Number()
)

// unmarshalRequest decodes buf as proto.Unmarshal would, except that the body of a request or response body
// message aliases buf instead of being copied (aliased). Encodings a sender has no reason to produce (a body
// field, or a member of the request oneof, more than once) go to proto.Unmarshal, whose merge rules they need.
func unmarshalRequest(buf []byte, req *extprocv3.ProcessingRequest) (aliased bool, err error) {
	num, httpBody, rest, ok := splitField(buf, func(n protowire.Number) bool {
		return requestOneof.Fields().ByNumber(n) != nil
	})
	if !ok || (num != requestBodyNum && num != responseBodyNum) {
		return false, proto.Unmarshal(buf, req)
	}
	_, body, hbRest, ok := splitField(httpBody, func(n protowire.Number) bool { return n == httpBodyBodyNum })
	if !ok {
		return false, proto.Unmarshal(buf, req)
	}
	if err := proto.Unmarshal(rest, req); err != nil {
		return false, err
	}
	hb := &extprocv3.HttpBody{}
	if err := proto.Unmarshal(hbRest, hb); err != nil {
		return false, err
	}
	hb.Body = body[:len(body):len(body)] // an append to it must not write into buf
	if num == requestBodyNum {
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: hb}
	} else {
		req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: hb}
	}
	return true, nil
}

// splitField finds the one length-delimited field of a message's encoding that pick chooses, and returns its
// number, its value (aliasing msg) and the message's other fields, in order. ok is false when msg does not
// parse, or when pick chooses no field, more than one, or one that is not length-delimited.
func splitField(msg []byte, pick func(protowire.Number) bool) (num protoreflect.FieldNumber, value, rest []byte,
	ok bool) {
	rest = make([]byte, 0, 256)
	for b := msg; len(b) > 0; {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return 0, nil, nil, false
		}
		valLen := protowire.ConsumeFieldValue(n, typ, b[tagLen:])
		if valLen < 0 {
			return 0, nil, nil, false
		}
		field := b[:tagLen+valLen]
		b = b[tagLen+valLen:]
		if !pick(n) {
			rest = append(rest, field...)
			continue
		}
		if num != 0 || typ != protowire.BytesType {
			return 0, nil, nil, false
		}
		num = n
		value, _ = protowire.ConsumeBytes(field[tagLen:])
	}
	return num, value, rest, num != 0
}

// handedOverBody is a ProcessingResponse whose BUFFERED body mutation is the contents of body, a buffer handed to
// gRPC with it. The codec sends the body from that buffer instead of copying it (about half a millisecond per
// 4 MiB in which no other request gets the processor), and gRPC frees it, to the shared pool, once it has
// been written: its sender must not touch the buffer again.
type handedOverBody struct {
	resp *extprocv3.ProcessingResponse
	body mem.Buffer
}

// The fields from a ProcessingResponse down to its whole-body mutation, from the generated descriptors.
var (
	responseDesc  = (&extprocv3.ProcessingResponse{}).ProtoReflect().Descriptor()
	responseOneof = responseDesc.Oneofs().ByName("response")
	bodyPath      = []protoreflect.FieldDescriptor{
		(&extprocv3.BodyResponse{}).ProtoReflect().Descriptor().Fields().ByName("response"),
		(&extprocv3.CommonResponse{}).ProtoReflect().Descriptor().Fields().ByName("body_mutation"),
		(&extprocv3.BodyMutation{}).ProtoReflect().Descriptor().Fields().ByName("body"),
	}
)

// Marshal encodes a message to send.
func (c bodyCodec) Marshal(v any) (mem.BufferSlice, error) {
	p, ok := v.(handedOverBody)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	m := p.resp.ProtoReflect()
	top := m.WhichOneof(responseOneof)
	if top == nil || top.Message() != bodyPath[0].ContainingMessage() { // not a body response
		return c.marshalCopying(p)
	}
	path := append([]protoreflect.FieldDescriptor{top}, bodyPath...)
	head, tail, ok := around(m, path, p.body.ReadOnlyData())
	if !ok {
		return c.marshalCopying(p)
	}
	return mem.BufferSlice{mem.SliceBuffer(head), p.body, mem.SliceBuffer(tail)}, nil
}

// marshalCopying encodes a response whose body is not where handedOverBody says: as grpc-go's codec would, the
// body copied, and only then the buffer freed.
func (c bodyCodec) marshalCopying(p handedOverBody) (mem.BufferSlice, error) {
	defer p.body.Free()
	return c.CodecV2.Marshal(p.resp)
}

// around returns m's encoding as the bytes before and after the value of the bytes field at the end of path,
// which must be body itself (not a copy of it); ok is false when it is not, when a field on the path is not
// set, or when a message does not marshal. A message's other fields go before
// and after the one on the path by number (proto.Marshal has an order of its own; a decoder takes any).
func around(m protoreflect.Message, path []protoreflect.FieldDescriptor, body []byte) (head, tail []byte, ok bool) {
	f := path[0]
	if !m.Has(f) {
		return nil, nil, false
	}
	others := m.New()
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd != f {
			others.Set(fd, v)
		}
		return true
	})
	others.SetUnknown(m.GetUnknown())
	enc, err := proto.Marshal(others.Interface())
	if err != nil {
		return nil, nil, false
	}
	before, after := splitBefore(enc, f.Number())
	var innerHead, innerTail []byte
	if len(path) == 1 {
		if v := m.Get(f).Bytes(); len(v) != len(body) || len(body) == 0 || &v[0] != &body[0] {
			return nil, nil, false
		}
	} else if innerHead, innerTail, ok = around(m.Get(f).Message(), path[1:], body); !ok {
		return nil, nil, false
	}
	head = append(make([]byte, 0, len(before)+16+len(innerHead)), before...)
	head = protowire.AppendTag(head, f.Number(), protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(innerHead)+len(body)+len(innerTail)))
	head = append(head, innerHead...)
	return head, append(innerTail, after...), true
}

// splitBefore splits a message's encoding before its first field numbered above n.
func splitBefore(enc []byte, n protowire.Number) (before, after []byte) {
	for b := enc; len(b) > 0; {
		num, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 || num > n {
			return enc[:len(enc)-len(b)], b
		}
		valLen := protowire.ConsumeFieldValue(num, typ, b[tagLen:])
		if valLen < 0 {
			return enc[:len(enc)-len(b)], b
		}
		b = b[tagLen+valLen:]
	}
	return enc, nil
}
