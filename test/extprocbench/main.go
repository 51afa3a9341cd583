// Command extprocbench measures infergate's decision latency the way Envoy drives it: one ext_proc stream per
// request over loopback gRPC, for several prompt sizes, both request body modes and two concurrencies. It
// prints a Markdown table of medians over several runs (p50, p99, requests/s, allocations per request).
//
//	go run ./test/extprocbench -runs 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/loadgen"
)

type config struct {
	promptBytes int
	mode        filterv3.ProcessingMode_BodySendMode
	concurrency int
	requests    int
}

type result struct {
	p50, p99    time.Duration
	rps         float64
	allocsPerRq float64
	// latencies are the run's request latencies, sorted.
	latencies []time.Duration
}

func main() {
	policyPath := flag.String("policy", "examples/quickstart/policy.yaml", "policy file")
	runs := flag.Int("runs", 3, "runs per configuration; the table shows medians")
	scale := flag.Float64("scale", 1, "multiply the request counts (lower for a quick look)")
	chunk := flag.Int("chunk", 16384, "request body frame size Envoy forwards in FULL_DUPLEX_STREAMED mode")
	only := flag.String("only", "", "run only rows whose description, \"| 2 KiB | BUFFERED | 8 |\", contains this (e.g. \"256 KiB | FULL\"; \"| 2 KiB\" leaves out 32 KiB)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	quotaRuns := flag.Bool("quota", true, "also measure the latency quotas add (starts a redis-server on a free port)")
	telemetryRuns := flag.Bool("telemetry", true, "also measure the latency telemetry adds (traces, audit log, goodput series)")
	telemetryOnly := flag.Bool("telemetry-only", false, "measure only the telemetry rows")
	telemetryRunCount := flag.Int("telemetry-runs", 15, "runs per telemetry row: their ratios are medians over thirds of the runs, and a +5 % target needs many")
	placementRuns := flag.Bool("placement", true, "also compare SLO placement's decision latency with placement: affinity on the same policy")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	snap, err := policies.LoadFile(*policyPath)
	if err != nil {
		log.Fatal(err)
	}
	extproc.InstallBufferPool() // as infergate serve does
	gcPercent := 400            // infergate serve's default unless GOGC is set
	if os.Getenv("GOGC") != "" {
		gcPercent = debug.SetGCPercent(-1)
	}
	debug.SetGCPercent(gcPercent)
	client, stopInfergate := startGateway(*policyPath)
	defer stopInfergate()
	baseline, stopBaseline := startBaseline()
	defer stopBaseline()

	if *telemetryOnly {
		benchTelemetry(snap, *telemetryRunCount, *scale, *chunk, *only)
		return
	}
	fmt.Printf("GOMAXPROCS=%d, %s, GOGC=%d, %d runs per row (medians), body frames of %d bytes in FULL_DUPLEX_STREAMED\n\n",
		runtime.GOMAXPROCS(0), runtime.Version(), gcPercent, *runs, *chunk)
	fmt.Println("infergate as `infergate serve` builds it (SLO placement, a rollout, every span traced, the audit log with digests,")
	fmt.Println("the goodput series) against the no-op floor, runs interleaved; ratios are the median of the runs' ratios.")
	fmt.Println()
	fmt.Println("| prompt | body mode | concurrency | p50 | p99 | requests/s | floor p50 | floor p99 | floor requests/s | requests/s ÷ floor | p99 ÷ floor | allocs/decision | target |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	var rows []rowResult
	for _, cfg := range mainConfigs(*scale) {
		desc := rowDesc(cfg.promptBytes, cfg.mode, cfg.concurrency)
		if !strings.Contains(desc, *only) {
			continue
		}
		row := measureRow(client, baseline, cfg, *runs, *chunk)
		rows = append(rows, row)
		fmt.Printf("%s %s | %s | %.0f | %s | %s | %.0f | %.2f | %.2f | %.0f | %s |\n", desc, fmtDur(row.med.p50), fmtDur(row.med.p99), row.med.rps,
			fmtDur(row.floor.p50), fmtDur(row.floor.p99), row.floor.rps, row.rpsRatio, row.p99Ratio, row.allocs, row.verdict())
	}
	checkHotPath(rows)
	if *placementRuns {
		benchPlacement(*policyPath, *runs, *scale, *chunk)
	}
	if *quotaRuns {
		benchQuotas(*policyPath, *runs, *scale, *chunk)
	}
	if *telemetryRuns {
		benchTelemetry(snap, *telemetryRunCount, *scale, *chunk, *only)
	}
}

// startProcessor serves an ext_proc server on loopback and returns a client configured as the bench's Envoy.
func startProcessor(srv *extproc.Server) (extprocv3.ExternalProcessorClient, func()) {
	gs := grpc.NewServer(extproc.ServerOptions()...)
	srv.Register(gs)
	return serveAndDial(gs)
}

func serveAndDial(gs *grpc.Server) (extprocv3.ExternalProcessorClient, func()) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	// Envoy's HTTP/2 windows default to 256 MiB; the processor's answers are never held by flow control.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(extproc.MaxMessageBytes), grpc.MaxCallRecvMsgSize(extproc.MaxMessageBytes)),
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(64<<20),
		// Envoy (C++) does not zero a 1 MiB buffer per message as grpc-go's default pool does; keep the
		// emulated client from charging that to the processor.
		experimental.WithBufferPool(&extproc.BufferPool{}))
	if err != nil {
		log.Fatal(err)
	}
	return extprocv3.NewExternalProcessorClient(conn), func() { conn.Close(); gs.Stop() }
}

func modeName(m filterv3.ProcessingMode_BodySendMode) string {
	if m == filterv3.ProcessingMode_BUFFERED {
		return "BUFFERED"
	}
	return "FULL_DUPLEX_STREAMED"
}

// rowDesc is the start of a row as the tables print it, "| 2 KiB | BUFFERED | 8 |", which -only matches.
func rowDesc(promptBytes int, mode filterv3.ProcessingMode_BodySendMode, concurrency int) string {
	return fmt.Sprintf("| %d KiB | %s | %d |", promptBytes>>10, modeName(mode), concurrency)
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

// chatBody builds a chat request of about n bytes: a long system prompt and a short question, to a model whose
// pools serve another name, so the body rewrite is part of what is measured.
func chatBody(n int) []byte {
	head := `{"model":"llama-3.3-70b","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"`
	tail := `"},{"role":"user","content":"What is the capital of France?"}]}`
	fill := max(0, n-len(head)-len(tail))
	words := strings.Repeat("You are a helpful assistant who answers briefly. ", fill/49+1)[:fill]
	return []byte(head + words + tail)
}

func requestHeaders(bodyLen int) *corev3.HeaderMap {
	return &corev3.HeaderMap{Headers: append(slices.Clone(baseHeaders),
		&corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(bodyLen))})}
}

var baseHeaders = []*corev3.HeaderValue{
	{Key: ":method", RawValue: []byte("POST")},
	{Key: ":path", RawValue: []byte("/v1/chat/completions")},
	{Key: ":authority", RawValue: []byte("gateway")},
	{Key: "content-type", RawValue: []byte("application/json")},
	{Key: "authorization", RawValue: []byte("Bearer sk-demo-acme")},
	{Key: "x-request-id", RawValue: []byte("bench")},
}

// oneRequest runs one request's stream and returns the time from request headers to the routing decision
// being complete (for FULL_DUPLEX_STREAMED, the last streamed body chunk).
func oneRequest(client extprocv3.ExternalProcessorClient, cfg config, body []byte, chunk int) (time.Duration, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := client.Process(ctx)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: cfg.mode, ResponseBodyMode: filterv3.ProcessingMode_NONE},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: requestHeaders(len(body))}},
	}); err != nil {
		return 0, err
	}
	var elapsed time.Duration
	if cfg.mode == filterv3.ProcessingMode_BUFFERED {
		if _, err := st.Recv(); err != nil {
			return 0, err
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return 0, err
		}
		r, err := st.Recv()
		if err != nil {
			return 0, err
		}
		if r.GetRequestBody() == nil {
			return 0, fmt.Errorf("unexpected answer %v", r)
		}
		elapsed = time.Since(start)
	} else {
		for off := 0; off < len(body); off += chunk {
			end := min(off+chunk, len(body))
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}); err != nil {
				return 0, err
			}
		}
		for {
			r, err := st.Recv()
			if err != nil {
				return 0, err
			}
			if r.GetImmediateResponse() != nil {
				return 0, fmt.Errorf("rejected: %s", r.GetImmediateResponse().GetBody())
			}
			if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				break
			}
		}
		elapsed = time.Since(start)
	}
	// Finish the request as Envoy would, so in-flight counts return to zero.
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}}); err != nil {
		return 0, err
	}
	if _, err := st.Recv(); err != nil {
		return 0, err
	}
	_ = st.CloseSend()
	if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("closing stream: %w", err)
	}
	return elapsed, nil
}

func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func measure(client extprocv3.ExternalProcessorClient, cfg config, body []byte, chunk int) (result, error) {
	// Warm up connections and pools.
	for range 20 {
		if _, err := oneRequest(client, cfg, body, chunk); err != nil {
			return result{}, err
		}
	}
	runtime.GC()
	lat := make([]time.Duration, cfg.requests)
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	allocs0 := heapAllocs()
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.requests {
					return
				}
				d, err := oneRequest(client, cfg, body, chunk)
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				lat[i] = d
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	allocs := heapAllocs() - allocs0
	if firstErr != nil {
		return result{}, firstErr
	}
	slices.Sort(lat)
	return result{
		p50:         lat[len(lat)/2],
		p99:         lat[len(lat)*99/100],
		rps:         float64(cfg.requests) / wall.Seconds(),
		allocsPerRq: float64(allocs) / float64(cfg.requests),
		latencies:   lat,
	}, nil
}

func medianResult(rs []result) result {
	pick := func(f func(result) float64) float64 { return loadgen.Median(rs, f) }
	return result{
		p50:         time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99:         time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
		rps:         pick(func(r result) float64 { return r.rps }),
		allocsPerRq: pick(func(r result) float64 { return r.allocsPerRq }),
	}
}

// echoProcessor is the baseline: it exchanges the same messages as infergate on the same transport but does no
// work (no parsing, no decision), echoing the body back as infergate does when it rewrites it. The difference
// between the two is what infergate itself costs.
type echoProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (echoProcessor) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	mode := filterv3.ProcessingMode_BUFFERED
	var body []byte
	dest := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: contract.HeaderDestination, RawValue: []byte("127.0.0.1:1")}}}}
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if pc := m.GetProtocolConfig(); pc != nil {
			mode = pc.GetRequestBodyMode()
		}
		var out []*extprocv3.ProcessingResponse
		switch r := m.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if mode == filterv3.ProcessingMode_BUFFERED {
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if !r.RequestBody.GetEndOfStream() {
				continue
			}
			if mode == filterv3.ProcessingMode_BUFFERED {
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
					Response: &extprocv3.CommonResponse{HeaderMutation: dest, ClearRouteCache: true,
						BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}}}}})
				break
			}
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: dest, ClearRouteCache: true}}}})
			for off := 0; off < len(body); off += 62000 {
				end := min(off+62000, len(body))
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
					Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
						StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body[off:end], EndOfStream: end == len(body)}}}}}}})
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
		}
		for _, r := range out {
			if err := st.Send(r); err != nil {
				return nil
			}
		}
	}
}

// startBaseline serves echoProcessor on loopback with the same server and client options as infergate.
func startBaseline() (extprocv3.ExternalProcessorClient, func()) {
	gs := grpc.NewServer(extproc.ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(gs, echoProcessor{})
	return serveAndDial(gs)
}

func init() {
	log.SetFlags(0)
	log.SetOutput(os.Stderr)
}
