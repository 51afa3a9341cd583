package extproc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/infergate/infergate/policies"
)

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
		head := `{"model":"llama-3.3-70b","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"`
		tail := `"},{"role":"user","content":"What is the capital of France?"}]}`
		body := []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
		hdrs := postHeaders("/v1/chat/completions", "sk-demo-acme", "x-request-id", "bench", "content-length", strconv.Itoa(len(body)))
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
				for b.Loop() {
					rs := &requestState{srv: srv, seenFirst: true, reqMode: mode.m, respMode: modeNone}
					rs.handle(hdrs)
					for i := range frames {
						rs.handle(reqBody(frames[i], i == len(frames)-1))
					}
					rs.handle(done)
				}
			})
		}
	}
}
