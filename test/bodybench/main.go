// Command bodybench measures what hostile request bodies cost infergate: `infergate serve`, as shipped, in a
// process of its own on one CPU, while 64 clients with valid keys send 4 MiB bodies that hold two million
// elements in a field the gateway ignores (half to a model their tenant may call, half to one it may not),
// as fast as the gateway answers them. Beside them a tenant sends ordinary chat requests; their decision
// latency is compared with the same gateway's unloaded, in the same run. It prints a Markdown table of
// several runs and the targets (issue #36) as met or not met.
//
//	go run ./test/bodybench -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

func main() {
	runs := flag.Int("runs", 3, "runs, each with a gateway of its own")
	hostile := flag.Int("hostile", 64, "hostile clients, each with one body in flight at a time")
	bodyMiB := flag.Int("body-mib", 4, "size of a hostile body in MiB (the policy's maxRequestBodyBytes is raised to fit)")
	loaded := flag.Duration("loaded", 10*time.Second, "how long the hostile clients send")
	modes := flag.String("modes", "FULL_DUPLEX_STREAMED,BUFFERED", "request body modes to measure (the shipped Envoy configs use FULL_DUPLEX_STREAMED)")
	chunk := flag.Int("chunk", 16384, "body frame size Envoy forwards in FULL_DUPLEX_STREAMED mode")
	unloaded := flag.Duration("unloaded", 5*time.Second, "how long the ordinary requests are measured alone first")
	ordinaryProcess := flag.Bool("ordinary-process", false, "send the ordinary requests from a process and connection of their own, as an independent sender (Envoy's worker) would; false: from the hostile clients' process and connection")
	procs := flag.Int("gateway-gomaxprocs", 0, "the gateway's GOMAXPROCS on its one CPU (0: Go's default, 1); an experiment: more Ps than CPUs time-slice among threads (RELIABILITY.md)")
	child := flag.String("ordinary-child", "", "(internal) run only the ordinary clients against this ext_proc address and report their latencies")
	childFor := flag.Duration("ordinary-for", 0, "(internal) how long the ordinary clients run")
	flag.Parse()
	if *child != "" {
		m := filterv3.ProcessingMode_BodySendMode(filterv3.ProcessingMode_BodySendMode_value[*modes])
		if err := ordinaryChild(&bench{ordinary: ordinaryBody(), mode: m, chunk: *chunk}, *child, *childFor); err != nil {
			log.Fatal(err)
		}
		return
	}
	log.SetFlags(0)
	root, err := os.Getwd()
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "infergate-bodybench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	b, err := newBench(root, dir, *bodyMiB<<20)
	if err != nil {
		log.Fatal(err)
	}
	b.gatewayProcs = *procs
	fmt.Printf("infergate serve on CPU %s (GOMAXPROCS %d there), clients on the others; %d hostile clients × %d MiB bodies for %s; ordinary clients in a process of their own: %v; %s\n\n",
		b.gatewayCPU, max(1, *procs), *hostile, *bodyMiB, *loaded, *ordinaryProcess, runtime.Version())
	fmt.Println("| body mode | run | peak RSS | hostile answered/s | hostile answers | ordinary p50 unloaded | p99 unloaded | p50 under attack | p99 under attack | p99 ratio | ordinary errors | alive |")
	fmt.Println("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
	var results []runResult
	b.chunk, b.ordinaryProcess = *chunk, *ordinaryProcess
	for mode := range strings.SplitSeq(*modes, ",") {
		m, ok := filterv3.ProcessingMode_BodySendMode_value[strings.TrimSpace(mode)]
		if !ok {
			log.Fatalf("unknown body mode %q", mode)
		}
		b.mode = filterv3.ProcessingMode_BodySendMode(m)
		for i := range *runs {
			ctx, cancel := context.WithCancel(context.Background())
			r, err := b.run(ctx, *hostile, *unloaded, *loaded)
			cancel()
			if err != nil {
				log.Fatalf("%s run %d: %v", mode, i+1, err)
			}
			results = append(results, r)
			fmt.Printf("| %s | %d | %s | %.1f | %s | %s | %s | %s | %s | %.2f | %d of %d | %v |\n", mode, i+1, mib(r.peakRSS),
				r.hostileRate, r.hostileAnswers, ms(r.unloaded.p50), ms(r.unloaded.p99), ms(r.loaded.p50), ms(r.loaded.p99),
				r.p99Ratio(), r.ordinaryErrors, r.ordinaryRequests, r.alive)
		}
	}
	report(results)
}

// report prints the targets against the median and the worst run.
func report(rs []runResult) {
	rss := make([]float64, len(rs))
	ratios := make([]float64, len(rs))
	alive := true
	errors := 0
	for i, r := range rs {
		rss[i], ratios[i] = float64(r.peakRSS), r.p99Ratio()
		alive = alive && r.alive
		errors += r.ordinaryErrors
	}
	fmt.Println()
	target := func(name string, med, worst float64, unit string, ok bool) {
		verdict := "met"
		if !ok {
			verdict = "NOT MET"
		}
		fmt.Printf("- %s: median %.2f%s, worst %.2f%s — %s\n", name, med, unit, worst, unit, verdict)
	}
	target("peak RSS ≤ 512 MiB", median(rss)/(1<<20), slices.Max(rss)/(1<<20), " MiB", slices.Max(rss) <= 512<<20)
	target("ordinary decision p99 under attack ≤ 2× unloaded", median(ratios), slices.Max(ratios), "×", slices.Max(ratios) <= 2)
	verdict := "met"
	if !alive || errors > 0 {
		verdict = "NOT MET"
	}
	fmt.Printf("- the gateway alive and every ordinary request routed: %d errors, alive in every run — %s\n", errors, verdict)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

// policyFor is the quickstart's policy, with maxRequestBodyBytes raised when a hostile body would not fit.
func policyFor(root, dir string, bodyBytes int) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "examples/quickstart/policy.yaml"))
	if err != nil {
		return "", err
	}
	text := string(data)
	const line = "maxRequestBodyBytes: 4194304"
	if !strings.Contains(text, line) {
		return "", fmt.Errorf("the quickstart policy changed shape: no %q", line)
	}
	text = strings.Replace(text, line, fmt.Sprintf("maxRequestBodyBytes: %d", max(4<<20, bodyBytes)), 1)
	path := filepath.Join(dir, "policy.yaml")
	return path, os.WriteFile(path, []byte(text), 0o600)
}
