// Command demo runs the quickstart: a simulated heterogeneous fleet, `infergate serve` with the quickstart
// policy, the Envoy-faithful data plane on 127.0.0.1:8080, and shared-prefix chat traffic from three tenants.
// It prints a live table every second and a summary at the end. Ctrl-C stops everything; DEMO_DURATION=30s
// stops by itself.
//
//	go run ./test/demo --infergate bin/infergate
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/test/e2e"
	"github.com/infergate/infergate/test/loadgen"
)

type tenant struct {
	name, key string
	models    []string
	rate      float64 // requests per second
}

var tenants = []tenant{
	{"acme", "sk-demo-acme", []string{"llama-3.3-70b", "qwen2.5-7b"}, 6},
	{"globex", "sk-demo-globex", []string{"llama-70b", "qwen2.5-7b"}, 4},
	{"initech", "sk-demo-initech", []string{"qwen-7b", "llama-3.3-70b"}, 2}, // llama is not allowed: 403s
}

// sample is one finished request as the client saw it.
type sample struct {
	at              time.Duration // when it finished, from the start of the traffic
	model           string
	tenant, replica string
	status          int
	ttft            time.Duration
	prompt, cached  int64
	completion      int64
}

type stats struct {
	mu      sync.Mutex
	start   time.Time
	samples []sample
}

func (s *stats) add(x sample) {
	s.mu.Lock()
	x.at = time.Since(s.start)
	s.samples = append(s.samples, x)
	s.mu.Unlock()
}

func (s *stats) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

func main() {
	bin := flag.String("infergate", "bin/infergate", "infergate binary to run as `serve`")
	envoyFile := flag.String("envoy", "deploy/envoy/envoy-xds.yaml", "Envoy config the data plane reads (the production shape: clusters and routes from infergate's xDS)")
	listen := flag.String("listen", "127.0.0.1:8080", "data plane address")
	flag.Parse()
	duration := time.Duration(0)
	if v := os.Getenv("DEMO_DURATION"); v != "" && v != "0" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "demo: bad DEMO_DURATION:", err)
			os.Exit(2)
		}
		duration = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin, *envoyFile, *listen, duration); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// The fixed addresses of the demo's infergate and its fleet file.
const (
	extprocAddr = "127.0.0.1:9002"
	metricsAddr = "127.0.0.1:9090"
	xdsAddr     = "127.0.0.1:18000"
	adminAddr   = "127.0.0.1:9091"
	fleetFile   = "examples/quickstart/fleet.yaml"
)

func run(ctx context.Context, bin, envoyFile, listen string, duration time.Duration) error {
	root, err := e2e.FindRoot()
	if err != nil {
		return err
	}
	addrs, err := demoPorts(root, fleetFile, listen)
	if err != nil {
		return err
	}
	if err := checkPorts(addrs); err != nil {
		return err
	}
	// infergate itself runs as its own process, exactly as in production.
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	logFile, err := os.CreateTemp("", "infergate-demo-*.log")
	if err != nil {
		return err
	}
	defer logFile.Close()
	auditDir, err := os.MkdirTemp("", "infergate-demo-audit-")
	if err != nil {
		return err
	}
	// The quickstart policy, its managed API pointed at the simulated one (whose certificate Envoy trusts).
	caDir, err := os.MkdirTemp("", "infergate-demo-ca-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(caDir)
	policyPath, err := demoPolicy(root, caDir, os.Getenv("DEMO_SCENARIO"))
	if err != nil {
		return err
	}
	args := []string{"serve", "--policy", policyPath,
		"--extproc-addr", extprocAddr, "--metrics-addr", metricsAddr, "--xds-addr", xdsAddr, "--admin-addr", adminAddr, "--audit-log", auditDir}
	if os.Getenv("DEMO_SCENARIO") == "region-down" {
		args = append(args, "--region", "us-east") // e2e.RegionalPolicy's home region
	}
	if redisAddr, stopRedis, err := loadgen.StartRedis(); err == nil {
		defer stopRedis()
		args = append(args, "--redis-addr", redisAddr)
		fmt.Printf("quotas: redis-server on %s\n", redisAddr)
	} else if os.Getenv("DEMO_SCENARIO") == "quota" {
		return fmt.Errorf("the quota scenario needs Redis to enforce quotas: %w", err)
	} else {
		fmt.Printf("quotas off: %v\n", err)
	}
	cmd := exec.CommandContext(serveCtx, bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, logFile, logFile
	cmd.Env = append(os.Environ(), "TOGETHER_API_KEY="+e2e.SimulatedProviderKey)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start infergate: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- cmd.Wait() }()
	if err := waitHTTP(ctx, "http://"+metricsAddr+"/healthz"); err != nil {
		return fmt.Errorf("infergate did not come up (log: %s): %w", logFile.Name(), err)
	}

	stackCtx, stopStack := context.WithCancel(context.Background())
	defer stopStack()
	st, err := e2e.Start(stackCtx, e2e.Options{Root: root, EnvoyFile: envoyFile, PolicyFile: "examples/quickstart/policy.yaml",
		FleetFile: fleetFile, ListenAddr: listen, ExtprocAddr: extprocAddr, XDSAddr: xdsAddr, ManagedCADir: caDir})
	if err != nil {
		return err
	}
	fmt.Printf("infergate demo: gateway %s, infergate ext_proc %s, metrics http://%s/metrics (log %s)\n",
		st.URL, extprocAddr, metricsAddr, logFile.Name())
	fmt.Print(telemetryWhere(metricsAddr, auditDir))
	fmt.Printf("try: curl %s/v1/chat/completions -H 'Authorization: Bearer sk-demo-acme' -d '{\"model\":\"llama-70b\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n\n", st.URL)

	time.Sleep(500 * time.Millisecond) // let infergate's first engine scrapes see the fleet
	s := &stats{}
	var wg sync.WaitGroup
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	for _, t := range tenants {
		wg.Add(1)
		go func() { defer wg.Done(); generate(trafficCtx, st.URL, t, s, &wg) }()
	}
	start := time.Now()
	s.start = start
	// DEMO_DURATION counts from the traffic's start, so that the summary's elapsed time is what was asked.
	var deadline <-chan time.Time
	if duration > 0 {
		deadline = time.After(duration)
	}
	sc, err := scenarioFor(os.Getenv("DEMO_SCENARIO"))
	if err != nil {
		return err
	}
	if b, ok := sc.(*burst); ok {
		b.record = s.add // a burst's requests are the tenant's too: its 429s belong in the tenant table
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-deadline:
			break loop
		case err := <-served:
			return fmt.Errorf("infergate exited: %v (log: %s)", err, logFile.Name())
		case <-tick.C:
			sc.step(st, time.Since(start))
			fmt.Print("\033[H\033[2J")
			render(os.Stdout, st, s.snapshot(), time.Since(start), false)
			goodput(os.Stdout, metricsAddr)
			fmt.Print(sc.status())
		}
	}
	// Goodput is read before the traffic stops: requests cut off by the demo's own end are not the fleet's.
	rows, goodErr := scrapeGoodput("http://" + metricsAddr + "/metrics")
	stopTraffic()
	wg.Wait()
	fmt.Print("\033[H\033[2J")
	render(os.Stdout, st, s.snapshot(), time.Since(start), true)
	if goodErr != nil {
		fmt.Printf("\n(goodput unavailable: %v)\n", goodErr)
	} else {
		renderGoodput(os.Stdout, rows)
	}
	fmt.Print(sc.summary(s.snapshot()))
	fmt.Print("\n" + telemetryWhere(metricsAddr, auditDir))
	stopServe()
	<-served
	fmt.Println("\nstopped: traffic, data plane, fleet and infergate.")
	return nil
}

func waitHTTP(ctx context.Context, url string) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("timed out")
}

// Shared system prompts: conversations in a group share a long prefix, as chat products and agents do.
var groups = func() []string {
	topics := []string{"retail returns", "travel bookings", "tax questions", "IT helpdesk", "insurance claims", "recipes", "car rentals", "school timetables"}
	out := make([]string, len(topics))
	for i, t := range topics {
		out[i] = strings.Repeat(fmt.Sprintf("You are the %s assistant; follow the policy handbook section %d exactly and cite it. ", t, i), 30)
	}
	return out
}()

// generate sends Poisson arrivals of streaming chat for one tenant until ctx ends.
func generate(ctx context.Context, base string, t tenant, s *stats, wg *sync.WaitGroup) {
	client := &http.Client{Timeout: 60 * time.Second}
	for {
		wait := time.Duration(rand.ExpFloat64() / t.rate * float64(time.Second))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := t.models[rand.IntN(len(t.models))]
			group := groups[rand.IntN(len(groups))]
			x := chat(ctx, client, base, t, model, group, fmt.Sprintf("Question %d: what applies here?", rand.IntN(1000)))
			if ctx.Err() == nil { // requests cut by the demo's own stop are not errors
				s.add(x)
			}
		}()
	}
}

func chat(ctx context.Context, client *http.Client, base string, t tenant, model, system, user string) sample {
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 32 + rand.IntN(32),
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}}})
	r := loadgen.StreamChat(ctx, client, base+"/v1/chat/completions", http.Header{"Authorization": {"Bearer " + t.key}}, body)
	return sample{model: model, tenant: t.name, replica: r.Replica, status: r.Status, ttft: r.TTFT, prompt: r.Prompt, cached: r.Cached, completion: r.Completion}
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f ms", float64(d)/1e6)
}

// inflight scrapes a replica's running + waiting requests.
func inflight(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "down"
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return "?"
	}
	get := func(name string) float64 {
		if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
		return 0
	}
	return fmt.Sprintf("%.0f", get("vllm:num_requests_running")+get("vllm:num_requests_waiting"))
}

func render(w io.Writer, st *e2e.Stack, samples []sample, elapsed time.Duration, final bool) {
	title := "live"
	if final {
		title = "summary"
	}
	fmt.Fprintf(w, "infergate demo (%s) — %s elapsed, gateway %s, simulated time runs 4x faster than the GPUs\n\n",
		title, elapsed.Round(time.Second), st.URL)
	fmt.Fprintf(w, "%-18s %6s %10s %10s %10s %9s\n", "REPLICA", "REQS", "TTFT p50", "TTFT p95", "CACHE HIT", "IN-FLIGHT")
	byReplica := map[string][]sample{}
	for _, x := range samples {
		if x.replica != "" {
			byReplica[x.replica] = append(byReplica[x.replica], x)
		}
	}
	var allTTFT []time.Duration
	var allPrompt, allCached int64
	rows := make([]struct{ name, addr string }, 0, len(st.Fleet.Replicas)+len(st.Fleet.Managed))
	for _, r := range st.Fleet.Replicas {
		rows = append(rows, struct{ name, addr string }{r.Name(), r.Addr()})
	}
	for _, m := range st.Fleet.Managed {
		rows = append(rows, struct{ name, addr string }{m.Name() + " (managed)", ""})
	}
	for _, r := range rows {
		xs := byReplica[strings.TrimSuffix(r.name, " (managed)")]
		var ttfts []time.Duration
		var prompt, cached int64
		for _, x := range xs {
			if x.ttft > 0 {
				ttfts = append(ttfts, x.ttft)
			}
			prompt, cached = prompt+x.prompt, cached+x.cached
		}
		allTTFT = append(allTTFT, ttfts...)
		allPrompt, allCached = allPrompt+prompt, allCached+cached
		hit := "-"
		if prompt > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*float64(cached)/float64(prompt))
		}
		load := "-"
		if r.addr != "" {
			load = inflight(r.addr)
		}
		fmt.Fprintf(w, "%-18s %6d %10s %10s %10s %9s\n", r.name, len(xs), ms(percentile(ttfts, .5)), ms(percentile(ttfts, .95)), hit, load)
	}
	hit := "-"
	if allPrompt > 0 {
		hit = fmt.Sprintf("%.0f%%", 100*float64(allCached)/float64(allPrompt))
	}
	fmt.Fprintf(w, "%-18s %6d %10s %10s %10s\n\n", "all replicas", len(allTTFT), ms(percentile(allTTFT, .5)), ms(percentile(allTTFT, .95)), hit)
	if len(byReplica["llama70b-l40s-0"])+len(byReplica["llama70b-l40s-1"]) == 0 {
		fmt.Fprint(w, "llama70b-l40s idle on purpose: a replica of four L40S costs more per token than an H200, so the 70B goes there\nwhen the H200s are full or down (DEMO_SCENARIO=region-down takes them down).\n\n")
	}

	fmt.Fprintf(w, "%-10s %6s %12s %12s %6s %6s %8s\n", "TENANT", "REQS", "TOKENS IN", "TOKENS OUT", "429s", "403s", "ERRORS")
	type agg struct{ reqs, in, out, r429, r403, errs int64 }
	byTenant := map[string]*agg{}
	for _, x := range samples {
		a := byTenant[x.tenant]
		if a == nil {
			a = &agg{}
			byTenant[x.tenant] = a
		}
		a.reqs++
		a.in += x.prompt
		a.out += x.completion
		switch {
		case x.status == 429:
			a.r429++
		case x.status == 403:
			a.r403++
		case x.status != 200:
			a.errs++
		}
	}
	names := make([]string, 0, len(byTenant))
	for n := range byTenant {
		names = append(names, n)
	}
	sort.Strings(names)
	forbidden := false
	for _, n := range names {
		a := byTenant[n]
		fmt.Fprintf(w, "%-10s %6d %12d %12d %6d %6d %8d\n", n, a.reqs, a.in, a.out, a.r429, a.r403, a.errs)
		forbidden = forbidden || a.r403 > 0
	}
	if forbidden {
		fmt.Fprintln(w, "\n403s are on purpose: initech also asks for llama-3.3-70b, which its tier may not use (model_not_allowed).")
	}
}
