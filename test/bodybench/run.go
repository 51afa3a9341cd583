package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/infergate/infergate/extproc"
)

// bench holds what every run shares: the gateway binary, the policy, the CPUs and the bodies.
type bench struct {
	bin, policy string
	gatewayCPU  string // the CPU the gateway runs on; "" when the machine has one
	clientCPUs  string
	hostile     []byte
	ordinary    []byte
	mode        filterv3.ProcessingMode_BodySendMode
	chunk       int // body frame size in FULL_DUPLEX_STREAMED mode
	// ordinaryProcess runs the ordinary clients in a process of their own (ordinary.go).
	ordinaryProcess bool
	// gatewayProcs, when above 0, is the gateway's GOMAXPROCS on its one CPU (0: Go's default, 1 there).
	gatewayProcs int
}

// The tenants of the quickstart policy the clients speak for: acme may call every model, initech only one
// the hostile bodies do not name, globex sends the ordinary requests.
const (
	keyAcme    = "sk-demo-acme"
	keyInitech = "sk-demo-initech"
	keyGlobex  = "sk-demo-globex"
)

func newBench(root, dir string, bodyBytes int) (*bench, error) {
	b := &bench{bin: filepath.Join(dir, "infergate")}
	build := exec.Command("go", "build", "-o", b.bin, "./cmd/infergate")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build infergate: %w", err)
	}
	var err error
	if b.policy, err = policyFor(root, dir, bodyBytes); err != nil {
		return nil, err
	}
	if n := runtime.NumCPU(); n > 1 {
		if _, err := exec.LookPath("taskset"); err == nil {
			b.gatewayCPU, b.clientCPUs = strconv.Itoa(n-1), fmt.Sprintf("0-%d", n-2)
		}
	}
	b.hostile = hostileBody(bodyBytes)
	b.ordinary = ordinaryBody()
	return b, nil
}

// ordinaryBody is the ordinary tenant's 2 KiB chat request.
func ordinaryBody() []byte {
	return []byte(`{"model":"qwen2.5-7b","stream":true,"max_tokens":64,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant who answers briefly. ", 40) + `"},{"role":"user","content":"What is the capital of France?"}]}`)
}

// hostileBody is a chat request of n bytes whose logit_bias holds about n/2 zeros: the elements cost a
// tree-building parser a heap allocation each.
func hostileBody(n int) []byte {
	head := `{"model":"llama-3.3-70b","messages":[{"role":"user","content":"hi"}],"logit_bias":[`
	tail := `0]}`
	count := max(0, (n-len(head)-len(tail))/2)
	return []byte(head + strings.Repeat("0,", count) + tail)
}

// latencies are one phase's ordinary decision latencies.
type latencies struct{ p50, p99 time.Duration }

func summarize(ds []time.Duration) latencies {
	if len(ds) == 0 {
		return latencies{}
	}
	slices.Sort(ds)
	return latencies{p50: ds[len(ds)/2], p99: ds[len(ds)*99/100]}
}

type runResult struct {
	peakRSS                          int64
	hostileRate                      float64
	hostileAnswers                   string
	unloaded, loaded                 latencies
	ordinaryErrors, ordinaryRequests int
	alive                            bool
}

func (r runResult) p99Ratio() float64 {
	if r.unloaded.p99 == 0 {
		return 0
	}
	return float64(r.loaded.p99) / float64(r.unloaded.p99)
}

// run starts a gateway, measures ordinary requests alone, then beside the hostile clients, and stops it.
func (b *bench) run(ctx context.Context, hostile int, unloaded, loaded time.Duration) (runResult, error) {
	var res runResult
	gw, err := b.start(ctx)
	if err != nil {
		return res, err
	}
	defer gw.stop()
	conn, err := grpc.NewClient(gw.extproc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(extproc.MaxMessageBytes), grpc.MaxCallRecvMsgSize(extproc.MaxMessageBytes)),
		grpc.WithInitialWindowSize(16<<20), grpc.WithInitialConnWindowSize(64<<20)) // Envoy's windows are larger still
	if err != nil {
		return res, err
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	if b.clientCPUs != "" {
		if err := pin(os.Getpid(), b.clientCPUs); err != nil {
			return res, err
		}
	}

	peak := watchRSS(ctx, gw.pid)
	var errs, total atomic.Int64
	lat, err := b.measureOrdinary(ctx, client, gw.extproc, unloaded, &errs, &total)
	if err != nil {
		return res, err
	}
	res.unloaded = summarize(lat)

	hostileCtx, stopHostile := context.WithCancel(ctx)
	answers := &answerCounts{warm: make(chan struct{}), warmAt: hostile}
	var wg sync.WaitGroup
	for i := range hostile {
		key := keyAcme
		if i%2 == 1 {
			key = keyInitech
		}
		wg.Go(func() { b.hostileLoop(hostileCtx, client, key, answers) })
	}
	select { // every hostile client has had an answer: the attack is at its pace
	case <-answers.warm:
	case <-ctx.Done():
		stopHostile()
		return res, ctx.Err()
	}
	before := answers.total()
	lat, err = b.measureOrdinary(ctx, client, gw.extproc, loaded, &errs, &total)
	if err != nil {
		stopHostile()
		wg.Wait()
		return res, err
	}
	res.loaded = summarize(lat)
	res.hostileRate = float64(answers.total()-before) / loaded.Seconds()
	stopHostile()
	wg.Wait()

	res.alive = gw.running()
	if _, err := b.ordinaryRequest(ctx, client); err != nil {
		res.alive = false
	}
	res.peakRSS = max(peak(), vmHWM(gw.pid))
	res.hostileAnswers = answers.String()
	res.ordinaryErrors, res.ordinaryRequests = int(errs.Load()), int(total.Load())
	return res, nil
}

// measureOrdinary runs the ordinary load for d, in a process of its own or on the hostile clients' connection.
func (b *bench) measureOrdinary(ctx context.Context, client extprocv3.ExternalProcessorClient, addr string, d time.Duration, errs, total *atomic.Int64) ([]time.Duration, error) {
	if b.ordinaryProcess {
		return b.ordinaryInChild(addr, d, errs, total)
	}
	return b.ordinaryLoad(ctx, client, d, errs, total), nil
}

// ordinaryLoad sends ordinary requests from two clients, one after another each, for d.
func (b *bench) ordinaryLoad(ctx context.Context, client extprocv3.ExternalProcessorClient, d time.Duration, errs, total *atomic.Int64) []time.Duration {
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var out []time.Duration
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				lat, err := b.ordinaryRequest(ctx, client)
				total.Add(1)
				if err != nil {
					errs.Add(1)
					continue
				}
				mu.Lock()
				out = append(out, lat)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// ordinaryRequest sends one ordinary request as Envoy does in BUFFERED mode and returns the time from its
// headers to the routing decision.
func (b *bench) ordinaryRequest(ctx context.Context, client extprocv3.ExternalProcessorClient) (time.Duration, error) {
	start := time.Now()
	resp, err := b.exchange(ctx, client, keyGlobex, b.ordinary)
	if err != nil {
		return 0, err
	}
	if !routed(resp) {
		return 0, fmt.Errorf("ordinary request not routed: %d %s", resp.GetImmediateResponse().GetStatus().GetCode(),
			resp.GetImmediateResponse().GetBody())
	}
	return time.Since(start), nil
}

// hostileLoop sends hostile bodies one after another until ctx ends.
func (b *bench) hostileLoop(ctx context.Context, client extprocv3.ExternalProcessorClient, key string, counts *answerCounts) {
	for ctx.Err() == nil {
		resp, err := b.exchange(ctx, client, key, b.hostile)
		switch {
		case err != nil && ctx.Err() != nil:
			counts.add("cut at the end")
		case err != nil:
			counts.add("error")
		case routed(resp):
			counts.add("routed")
		default:
			counts.add(strconv.Itoa(int(resp.GetImmediateResponse().GetStatus().GetCode())))
		}
	}
}

// routed reports whether an answer is a routing decision: the body's answer in BUFFERED mode, the deferred
// headers answer in FULL_DUPLEX_STREAMED.
func routed(r *extprocv3.ProcessingResponse) bool {
	return r.GetRequestBody() != nil || r.GetRequestHeaders() != nil
}

// exchange sends request headers and the body as Envoy does in the bench's mode (BUFFERED: one message after
// the headers' answer; FULL_DUPLEX_STREAMED: frames at once) and returns the routing decision or the immediate
// response that ended the request, then ends the stream.
func (b *bench) exchange(ctx context.Context, client extprocv3.ExternalProcessorClient, key string, body []byte) (*extprocv3.ProcessingResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.Process(ctx)
	if err != nil {
		return nil, err
	}
	headers := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "authorization", RawValue: []byte("Bearer " + key)}, {Key: "content-type", RawValue: []byte("application/json")},
		{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))},
	}}
	if err := st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: b.mode, ResponseBodyMode: filterv3.ProcessingMode_NONE},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headers}},
	}); err != nil {
		return nil, err
	}
	if b.mode == filterv3.ProcessingMode_BUFFERED {
		resp, err := st.Recv()
		if err != nil || resp.GetImmediateResponse() != nil {
			return resp, err
		}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return nil, err
		}
		return st.Recv()
	}
	// FULL_DUPLEX_STREAMED: frames go out while answers may come back (a refusal ends the stream early).
	sendErr := make(chan error, 1)
	go func() {
		for off := 0; off < len(body); off += b.chunk {
			end := min(off+b.chunk, len(body))
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- nil
	}()
	resp, err := st.Recv()
	cancel()
	<-sendErr
	return resp, err
}

// answerCounts counts the hostile requests' answers by kind.
type answerCounts struct {
	mu     sync.Mutex
	n      map[string]int
	sum    int
	warm   chan struct{} // closed at warmAt answers
	warmAt int
}

func (c *answerCounts) add(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind]++
	if c.sum++; c.sum == c.warmAt {
		close(c.warm)
	}
}

func (c *answerCounts) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum
}

func (c *answerCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	for k, v := range c.n {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// gateway is one `infergate serve` child process.
type gateway struct {
	pid     int
	extproc string
	exited  chan struct{}
	stop    func()
}

func (g *gateway) running() bool {
	select {
	case <-g.exited:
		return false
	default:
		return true
	}
}

// start runs infergate serve as shipped (its GOGC, no GOMEMLIMIT) on the gateway CPU, without xDS, admin or
// scraping, and waits until it is ready.
func (b *bench) start(ctx context.Context) (*gateway, error) {
	var addrs [2]string
	for i := range addrs {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs[i] = lis.Addr().String()
		lis.Close() // bound and released: on loopback the race is harmless
	}
	args := []string{b.bin, "serve", "--policy", b.policy, "--extproc-addr", addrs[0], "--xds-addr", "",
		"--metrics-addr", addrs[1], "--admin-addr", "", "--scrape-interval", "0", "--log-level", "error"}
	if b.gatewayCPU != "" {
		args = append([]string{"taskset", "-c", b.gatewayCPU}, args...)
	}
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GOMAXPROCS=")
	})
	if b.gatewayProcs > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(b.gatewayProcs))
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start infergate: %w", err)
	}
	g := &gateway{pid: cmd.Process.Pid, extproc: addrs[0], exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.exited) }()
	g.stop = func() { cancel(); <-g.exited }
	if err := waitReady(ctx, "http://"+addrs[1]+"/readyz", g.exited); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

// waitReady polls url until it answers 200, the process exits or 30 s pass.
func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("infergate exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling a child process's readiness
		}
	}
	return fmt.Errorf("infergate not ready after 30 s")
}

// pin sets every thread of process pid onto cpus.
func pin(pid int, cpus string) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset: %w: %s", err, out)
	}
	return nil
}

// watchRSS samples the process's resident memory every 20 ms until ctx ends; the returned function reads the
// peak so far.
func watchRSS(ctx context.Context, pid int) func() int64 {
	var peak atomic.Int64
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if rss := statusKiB(pid, "VmRSS:") << 10; rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return peak.Load
}

// vmHWM is the process's peak resident memory as the kernel counted it.
func vmHWM(pid int) int64 { return statusKiB(pid, "VmHWM:") << 10 }

// statusKiB reads a kB field of /proc/<pid>/status; 0 when it cannot.
func statusKiB(pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}
