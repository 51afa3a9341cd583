// Command admissionbench measures what the admission queue does for goodput under overload, end to end: the
// simulated fleet, infergate in process (as infergate serve builds it) and the Envoy-faithful data plane
// (deploy/envoy/envoy-xds.yaml), driven by open-loop Poisson traffic from three tiers. It first measures the
// fleet's capacity, then runs each variant at its load (3× capacity, and 1× for the baseline) followed by
// 0.5×, and reports medians of -runs with the targets met or not.
//
//	go run ./test/admissionbench            (make bench-admission)
//
// The starved rows run each gateway as a child process held to a fraction of one CPU (starved.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/gateway"
	"github.com/infergate/infergate/test/e2e"
	"github.com/infergate/infergate/test/envoysim"
)

func main() {
	runs := flag.Int("runs", 3, "runs per variant (the table shows medians)")
	overload := flag.Duration("overload", 20*time.Second, "how long the overload lasts")
	after := flag.Duration("after", 10*time.Second, "how long the 0.5× load lasts after it")
	timeScale := flag.Float64("timescale", 1, "real seconds per simulated second of the fleet")
	only := flag.String("only", "", "run only the variant of this name, or those (and the A/A run) whose name contains it")
	verbose := flag.Bool("v", false, "print the gateways' admission series after each run")
	aaTrials := flag.Int("aa", 12, "how many calm-and-after spans the A/A run lasts (0: none); it shows how often the recovery rule reads an overload where there was none")
	flag.Parse()
	log.SetFlags(0)
	root, err := e2e.FindRoot()
	if err != nil {
		log.Fatal(err)
	}
	b := &bench{root: root, timeScale: *timeScale, overload: *overload, after: *after, only: *only, verbose: *verbose,
		aaTrials: *aaTrials}
	if err := b.run(*runs); err != nil {
		log.Fatal(err)
	}
}

type bench struct {
	root            string
	timeScale       float64
	overload, after time.Duration
	only            string
	verbose         bool
	aaTrials        int
	// capacity is the requests per second the large model's fleet completes when saturated.
	capacity    float64
	uncontended time.Duration // TTFT p95 of an idle fleet
	starve      *starvation   // the starved rows' busy loop and gateway binary (nil when none runs)
}

// The fleet: the model every tier asks for on two H200 replicas with small batches (so that a few dozen
// requests a second saturate it, and the machine running the benchmark does not saturate first), and the
// cheaper model the pro tier degrades to on one L40S.
const (
	batch     = 16
	maxTokens = 64
)

func fleetConfig(timeScale float64) fleetsim.Config {
	cfg := fleetsim.Config{TimeScale: timeScale}
	for _, r := range []struct{ name, model, hw string }{
		{"big-0", "big-served", "h200"}, {"big-1", "big-served", "h200"}, {"small-0", "small-served", "l40s"},
	} {
		cfg.Replicas = append(cfg.Replicas, fleetsim.ReplicaConfig{Name: r.name, Addr: "127.0.0.1:0", Model: r.model,
			Hardware: r.hw, NumGPUBlocks: 8192, MaxNumSeqs: batch, MaxTokensDefault: maxTokens})
	}
	cfg.Replicas[2].MaxNumSeqs = 2 * batch
	return cfg
}

// run measures the capacity, then every variant -runs times (interleaved), and prints the table.
func (b *bench) run(runs int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.calibrate(ctx); err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	if slices.ContainsFunc(variants, func(v variant) bool { return v.starved && v.selected(b.only) }) {
		dir, err := os.MkdirTemp("", "admissionbench-bin")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if b.starve, err = newStarvation(b.root, dir); err != nil {
			return err
		}
	}
	results := map[string][]result{}
	for r := range runs {
		for _, v := range variants {
			if !v.selected(b.only) {
				continue
			}
			res, err := b.measure(ctx, v)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			results[v.name] = append(results[v.name], res)
			fmt.Fprintf(os.Stderr, "run %d  %-44s %s\n", r+1, v.name, res.summary())
		}
	}
	var aa aaResult
	if b.aaTrials > 0 && (b.only == "" || strings.Contains(aaName, b.only)) {
		var err error
		if aa, err = b.aa(ctx, b.aaTrials); err != nil {
			return fmt.Errorf("A/A: %w", err)
		}
	}
	b.report(os.Stdout, results, aa)
	return nil
}

// gatewayReplica is one gateway under test as the load and the report see it: its data plane, and its
// metrics.
type gatewayReplica struct {
	url    string
	gather func() ([]*dto.MetricFamily, error)
	pid    int // a starved gateway's process (0: in this process)
}

// stackFor starts a fleet and the variant's gateway replicas, each with its own data plane; all stop with ctx.
// A starved variant's gateways are child processes held to a fraction of a core (starved.go).
func (b *bench) stackFor(ctx context.Context, v variant) ([]gatewayReplica, error) {
	fleet, err := fleetsim.Start(ctx, fleetConfig(b.scale(v)))
	if err != nil {
		return nil, err
	}
	addrs := map[string]string{}
	for _, r := range fleet.Replicas {
		addrs[r.Name()] = r.Addr()
	}
	dir, err := os.MkdirTemp("", "admissionbench")
	if err != nil {
		return nil, err
	}
	go func() { <-ctx.Done(); _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(v.policy(addrs, b.scale(v))), 0o600); err != nil {
		return nil, err
	}
	if v.starved {
		return b.starvedReplicas(ctx, v, path, dir)
	}
	var reps []gatewayReplica
	for range max(1, v.replicas) {
		ecfg, err := envoysim.LoadFile(filepath.Join(b.root, "deploy/envoy/envoy-xds.yaml"))
		if err != nil {
			return nil, err
		}
		rep, err := e2e.StartReplica(ctx, ecfg, gateway.Config{PolicyPath: path, ScrapeInterval: scrapeEvery}, nil, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		reps = append(reps, gatewayReplica{url: rep.URL, gather: rep.Gateway.Registry.Gather})
	}
	return reps, nil
}

// starvedReplicas starts the busy loop and the variant's starved gateways, their logs in dir.
func (b *bench) starvedReplicas(ctx context.Context, v variant, policy, dir string) ([]gatewayReplica, error) {
	if b.starve == nil {
		return nil, fmt.Errorf("no starvation set up")
	}
	if err := b.starve.begin(ctx); err != nil {
		return nil, err
	}
	var reps []gatewayReplica
	for i := range max(1, v.replicas) {
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("infergate-%d.log", i)))
		if err != nil {
			return nil, err
		}
		go func() { <-ctx.Done(); logf.Close() }()
		g, err := b.starve.startGateway(ctx, b.root, policy, logf)
		if err != nil {
			log, _ := os.ReadFile(logf.Name()) // what it said before it went
			return nil, fmt.Errorf("gateway %d: %w; its log:\n%s", i, err, log)
		}
		reps = append(reps, gatewayReplica{url: g.url, gather: g.gather, pid: g.pid})
	}
	return reps, nil
}

// scale is the variant's real seconds per simulated second: the benchmark's, and twice it where the engines
// run at half speed.
func (b *bench) scale(v variant) float64 {
	if v.starved {
		return b.timeScale * starveSlowdown
	}
	return b.timeScale
}

// capacityOf is the large model's capacity in real requests per second at the variant's scale.
func (b *bench) capacityOf(v variant) float64 { return b.capacity * b.timeScale / b.scale(v) }

// beforeFor is how long each run takes 0.5× capacity before its overload, to learn what it returns to: after
// calmWarmup, about 58 requests (recovery.go).
const beforeFor = 8 * time.Second

// scrapeEvery is how often the gateways read the engines' metrics (infergate serve's default is 100 ms).
const scrapeEvery = 50 * time.Millisecond

// calibrate measures the large model's capacity with a closed loop that keeps every batch full with a queue
// behind it, calibrations times, and the TTFT of an idle fleet. Other work on the machine can only make the
// simulated fleet lag, never run ahead, so the highest reading is its capacity: one reading taken while the
// machine was busy (15.8 requests/s against 19.2) set every row's load a fifth lower.
func (b *bench) calibrate(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reps, err := b.stackFor(ctx, variantCalibration)
	if err != nil {
		return err
	}
	lg := newLoad(reps, false)
	idle := lg.closedLoop(ctx, 1, 3*time.Second)
	b.uncontended = percentile(ttfts(idle), 0.95)
	const busyFor = 10 * time.Second
	var readings []string
	for range calibrations {
		var done, refused, failed int
		for _, s := range lg.closedLoop(ctx, 4*batch, busyFor) {
			switch s.status {
			case http.StatusOK:
				done++
			case http.StatusTooManyRequests:
				refused++
			default:
				failed++
			}
		}
		reading := float64(done) / busyFor.Seconds()
		b.capacity = max(b.capacity, reading)
		readings = append(readings, fmt.Sprintf("%.1f (%d refused, %d failed)", reading, refused, failed))
	}
	if b.capacity == 0 {
		return fmt.Errorf("no request completed")
	}
	fmt.Fprintf(os.Stderr, "capacity %.1f requests/s (readings %s), idle TTFT p95 %v\n", b.capacity,
		strings.Join(readings, ", "), b.uncontended)
	return nil
}

// calibrations is how many times calibrate reads the capacity.
const calibrations = 3

// stretch is d of the benchmark's schedule at the variant's engine speed: the starved rows' engines run at half
// speed, so their phases last twice as long in real time and every row runs the same simulated schedule (the
// same requests). Timed in real seconds, the starved rows had half the simulated overload, and the misses of
// its first seconds (while nothing started in it has finished yet) counted twice as much in them.
func (b *bench) stretch(v variant, d time.Duration) time.Duration {
	return time.Duration(float64(d) * b.scale(v) / b.timeScale)
}

// measure runs one variant: its load for b.overload, then 0.5× capacity for b.after (each stretched).
func (b *bench) measure(ctx context.Context, v variant) (result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reps, err := b.stackFor(ctx, v)
	if err != nil {
		return result{}, err
	}
	// Before the overload, the calm load the run returns to: what its requests have with this configuration.
	before := newLoad(reps, v.singleTenant)
	warmFrom := time.Now().Add(b.stretch(v, calmWarmup))
	before.open(ctx, 0.5*b.capacityOf(v), b.stretch(v, beforeFor))
	calmEnd := time.Now() // the last calm request is sent; wait lets them finish
	calmSamples := sentIn(before.wait(), warmFrom, calmEnd)
	calm := calmOf(calmSamples)
	lg := newLoad(reps, v.singleTenant)
	peaks := watchPeaks(ctx, reps)
	start := time.Now()
	cpu := startCPUWatch(reps)
	lg.open(ctx, v.load*b.capacityOf(v), b.stretch(v, b.overload))
	calmFrom := time.Now()
	gatewayCPU := cpu.stop()
	lg.open(ctx, 0.5*b.capacityOf(v), b.stretch(v, b.after))
	samples := lg.wait()
	r := b.summarise(v, samples, start, calmFrom, calm, peaks.stop())
	r.gatewayCPU = gatewayCPU
	if b.verbose {
		dumpAdmission(reps)
		fmt.Fprintf(os.Stderr, "  enterprise late / sent by simulated second of the overload: %s\n",
			lateBySecond(samples, start, calmFrom, b.scale(v)))
		fmt.Fprintf(os.Stderr, "  recovery: requests that failed or were slower / sent (TTFT p95), each second after the overload; %s\n",
			b.recoveryTrace(v, samples, calmFrom, calm))
		fmt.Fprintf(os.Stderr, "  recovery read %v; the rule it replaced, %v\n", r.recovery,
			simulated(b.windowRecovery(v, samples, calmFrom, b.oldCalmP95(v, calmSamples, calmEnd)), b.scale(v)))
	}
	return r, nil
}

// dumpAdmission prints what the gateways' admission queues counted.
func dumpAdmission(reps []gatewayReplica) {
	for i, r := range reps {
		fams, _ := r.gather()
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), "infergate_admission_results") && f.GetName() != "infergate_admission_wait_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				v := m.GetCounter().GetValue()
				if h := m.GetHistogram(); h != nil {
					v = h.GetSampleSum() / math.Max(1, float64(h.GetSampleCount()))
					labels = append(labels, fmt.Sprintf("n=%d", h.GetSampleCount()))
					// A mean hides a few long waits: how many waited past the largest bound within half a second.
					if bound, within, ok := bucketAtMost(h, 0.5); ok {
						labels = append(labels, fmt.Sprintf("over %gs=%d", bound, h.GetSampleCount()-within))
					}
				}
				fmt.Fprintf(os.Stderr, "  replica %d %s{%s} %.3f\n", i, f.GetName(), strings.Join(labels, ","), v)
			}
		}
	}
}

// bucketAtMost is h's largest bucket bound not above limit and the observations within it.
func bucketAtMost(h *dto.Histogram, limit float64) (bound float64, within uint64, ok bool) {
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() <= limit && b.GetUpperBound() >= bound {
			bound, within, ok = b.GetUpperBound(), b.GetCumulativeCount(), true
		}
	}
	return bound, within, ok
}
