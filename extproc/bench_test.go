package extproc

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/test/redistest"
)

// benchRequest is the benchmarks' chat request of size bytes, a system prompt of plain letters and a question,
// and the request headers that announce it.
func benchRequest(size int) ([]byte, *extprocv3.ProcessingRequest) {
	head := `{"model":"llama-3.3-70b","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"`
	tail := `"},{"role":"user","content":"What is the capital of France?"}]}`
	body := []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
	return body, postHeaders("/v1/chat/completions", "sk-demo-acme", "x-request-id", "bench", "content-length", strconv.Itoa(len(body)))
}

// BenchmarkDecision measures the processor's own work per request (no gRPC): request headers, the body in
// one BUFFERED message or 16 KiB FULL_DUPLEX_STREAMED frames, the decision, and the response headers.
//
//	go test ./extproc -run xxx -bench Decision -benchmem -count 6
func BenchmarkDecision(b *testing.B) {
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	srv := New(Options{Policies: policies.NewStaticStore(snap)})
	for _, size := range []int{2 << 10, 32 << 10, 256 << 10} {
		body, hdrs := benchRequest(size)
		done := respHeaders("200", true)
		for _, mode := range []struct {
			name string
			m    bodyMode
		}{{"buffered", modeBuffered}, {"fullduplex", modeFullDuplex}} {
			var frames [][]byte
			if mode.m == modeFullDuplex {
				for off := 0; off < len(body); off += 16384 {
					frames = append(frames, body[off:min(off+16384, len(body))])
				}
			} else {
				frames = [][]byte{body}
			}
			b.Run(fmt.Sprintf("%dKiB/%s", size>>10, mode.name), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() { // as Process drives it: sent after each answer, close at the end
					rs := &requestState{srv: srv, seenFirst: true, reqMode: mode.m, respMode: modeNone, deferSettle: true}
					rs.handle(hdrs)
					for i := range frames {
						rs.handle(reqBody(frames[i], i == len(frames)-1))
						rs.sent()
					}
					rs.handle(done)
					rs.sent()
					rs.close()
				}
			})
		}
	}
}

// BenchmarkDecisionQuotas is the 2 KiB buffered decision with and without quotas (four limits, leases on,
// Redis on loopback): what admission and settlement add to the processor's own work.
// go test ./extproc -run '^$' -bench DecisionQuotas
func BenchmarkDecisionQuotas(b *testing.B) {
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Replace(string(src), "quota: {requestsPerSecond: 50, tokensPerMinute: 2000000, maxConcurrent: 64, monthlySpendUSD: 20000}",
		"quota: {requestsPerSecond: 100000, tokensPerMinute: 10000000000, maxConcurrent: 1000, monthlySpendUSD: 1000000}", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		b.Fatal(err)
	}
	redisSrv := redistest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, hdrs := benchRequest(2 << 10)
	done := respHeaders("200", true)
	for _, withQuotas := range []bool{false, true} {
		var c config
		if withQuotas {
			c.Director.Admission = quota.New(ctx, quota.Options{Addrs: []string{redisSrv.Addr}})
		}
		srv := newServer(policies.NewStaticStore(snap), c)
		b.Run(fmt.Sprintf("quotas=%v", withQuotas), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rs := &requestState{srv: srv, ctx: ctx, seenFirst: true, reqMode: modeBuffered, respMode: modeNone}
				rs.handle(hdrs)
				if r := rs.handle(reqBody(body, true)); len(r) == 0 || r[0].GetRequestBody() == nil {
					b.Fatalf("not routed: %v", r)
				}
				rs.handle(done)
			}
		})
	}
}
