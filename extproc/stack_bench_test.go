package extproc

import (
	"context"
	"fmt"
	"io"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/infergate/infergate/policies"
)

// memStream is one ext_proc stream in memory: Process reads msgs in turn, then io.EOF, and counts its answers.
type memStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*extprocv3.ProcessingRequest
	next int
	sent int
}

func (s *memStream) Context() context.Context { return s.ctx }

func (s *memStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next == len(s.msgs) {
		return nil, io.EOF
	}
	s.next++
	return s.msgs[s.next-1], nil
}

// RecvMsg is how Process reads (pooledRequest).
func (s *memStream) RecvMsg(m any) error {
	msg, err := s.Recv()
	if err == nil {
		m.(*pooledRequest).req = msg
	}
	return err
}

func (s *memStream) Send(*extprocv3.ProcessingResponse) error { s.sent++; return nil }

// SendMsg is how Process sends a large rewritten body (handedOverBody), whose buffer is then the stream's.
func (s *memStream) SendMsg(m any) error {
	if h, ok := m.(handedOverBody); ok {
		h.body.Free()
	}
	s.sent++
	return nil
}

// BenchmarkProcessOnANewGoroutine is a whole stream through Process on a goroutine of its own, as gRPC runs
// each stream: BenchmarkDecision's work plus what the goroutine's stack costs to grow to a decision's depth. A
// regression to growing it by doublings at depth (growStack, stack.go) shows here, not in BenchmarkDecision,
// whose goroutine keeps its grown stack.
//
//	go test ./extproc -run '^$' -bench ProcessOnANewGoroutine -benchmem
func BenchmarkProcessOnANewGoroutine(b *testing.B) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	srv := New(Options{Policies: policies.NewStaticStore(snap)})
	for _, size := range []int{2 << 10, 32 << 10} {
		body, hdrs := benchRequest(size)
		msgs := []*extprocv3.ProcessingRequest{hdrs, reqBody(body, true), respHeaders("200", true)}
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			done := make(chan int)
			for b.Loop() {
				st := &memStream{ctx: context.Background(), msgs: msgs}
				go func() {
					_ = srv.Process(st)
					done <- st.sent
				}()
				// Routed, the stream has an answer to each message; refused, it ends at the body with two.
				if sent := <-done; sent != len(msgs) {
					b.Fatalf("%d answers to %d messages: the request was not routed", sent, len(msgs))
				}
			}
		})
	}
}
