// Command fleetbench compares placement on a heterogeneous simulated fleet: three models (7B, 32B, 70B), each
// on two hardware classes (H200, MI300X, L40S), and a managed API per model as overflow, under a load that
// ramps from 0.5× to 1.5× the self-hosted capacity and back. Rows: round-robin, least-loaded, infergate
// ranking by affinity alone (cost-blind), infergate placing by SLO, then cost, and the same without a managed
// API but with the admission queue (what the fleet alone serves in time when the gateway holds back what it
// would serve late). Requests go straight from the picker's decision (or the queue) to the simulated replica,
// as in routingbench; TTFT (from arrival, the queue's wait included) and TPOT are measured by the client and
// handed back to the picker as the gateway does.
//
//	go run ./test/fleetbench
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/loadgen"
)

const managedKey = "sk-managed-bench"

// fleetOnly is the row of SLO placement with no managed API and the admission queue on: what the fleet alone
// serves within the SLO when the gateway holds what no endpoint would serve in time.
const fleetOnly = "infergate SLO+cost (fleet + queue)"

func main() {
	runs := flag.Int("runs", 3, "runs per policy; the table shows medians")
	duration := flag.Duration("duration", 60*time.Second, "simulated length of the load ramp (0.5× → 1.5× → 0.5×)")
	scale := flag.Float64("timescale", 1, "real seconds per simulated second")
	only := flag.String("policies", "", "run only these policies (comma-separated; round-robin always runs)")
	verbose := flag.Bool("v", false, "print every run")
	seed := flag.Uint64("seed", 11, "workload seed of the first run; run k draws its arrivals and prompts from seed+k, the same for every row")
	flag.Parse()
	timeScale = *scale
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := startFleet(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("Fleet (simulated time, time scale %.2f; %d replicas per pool, batch %d, %d KV blocks):\n\n", timeScale, replicasPerPool, maxNumSeqs, numGPUBlocks)
	fmt.Println("| model | class | $/GPU-hour | prefill tok/s | decode step (+ per seq) | decode tok/s at full batch | $/1M output at full batch | capacity req/s per replica |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---:|")
	for _, p := range pools {
		fmt.Printf("| %s | %s | %.2f | %.0f | %s (+%s) | %.0f | %.3f | %.2f |\n", p.model, p.class, classPrice[p.class], p.speed.PrefillTokensPerSecond,
			p.speed.DecodeStep, p.speed.DecodeStepPerSeq, decodeTPS(p.speed), classPrice[p.class]/3600/decodeTPS(p.speed)*1e6, capacity(p.speed))
	}
	fmt.Println()
	for _, m := range models {
		fmt.Printf("- %s: SLO TTFT %s, TPOT %s; managed API $%.2f/$%.2f per 1M in/out, %s to start, %s per token; self-hosted capacity %.1f req/s\n",
			m.name, m.ttft, m.tpot, m.managedIn, m.managedOut, m.managedLatency, m.perTok, env.capacity[m.name])
	}
	fmt.Printf("\nWorkload: %s of Poisson arrivals ramping 0.5× → 1.5× → 0.5× of each model's capacity; prompts of 500-2,000 tokens, "+
		"half of them opening with one of 8 shared system prompts (600 tokens) per model; 50-500 output tokens.\n\n", *duration)
	rows := []string{"round-robin", "least-loaded", "infergate cost-blind", "infergate SLO+cost", fleetOnly}
	results := map[string][]result{}
	for k := range *runs {
		for i, name := range rows {
			if !loadgen.Selected(*only, name, "round-robin") {
				continue
			}
			rt := env.router(name)
			work := workload(*duration, env.capacity, fmt.Sprintf("run%d-%d", k, i), *seed+uint64(k))
			r := env.run(rt, work, *duration)
			if *verbose {
				fmt.Fprintf(os.Stderr, "run %d %s: %+v\n", k, name, r)
				env.printBusy(r)
			}
			results[name] = append(results[name], r)
		}
	}
	report(rows, results)
}

// env is the running fleet and what the routers need of it.
type env struct {
	fl        *fleetsim.Fleet
	endpoints map[string][]string // model/class → addresses
	managed   map[string]*fleetsim.Managed
	scraper   *fleet.Scraper
	capacity  map[string]float64 // model → self-hosted req/s
	client    *http.Client       // plain HTTP to the fleet
	tlsClient *http.Client       // TLS to the managed APIs
	price     map[string]float64 // replica address → USD per GPU-hour
	speed     map[string]fleetsim.Hardware
	// kick is the admission queue of the row running, kicked after every round of scrapes as the gateway does.
	kick atomic.Pointer[admission.Queue]
}

func startFleet(ctx context.Context) (*env, error) {
	cfg := fleetsim.Config{TimeScale: timeScale}
	type key struct{ model, class string }
	var order []key
	for _, p := range pools {
		for i := range replicasPerPool {
			speed := p.speed
			cfg.Replicas = append(cfg.Replicas, fleetsim.ReplicaConfig{Name: fmt.Sprintf("%s-%s-%d", p.model, p.class, i), Addr: "127.0.0.1:0",
				Model: p.model, Hardware: p.class, NumGPUBlocks: numGPUBlocks, MaxNumSeqs: maxNumSeqs, Speed: &speed})
			order = append(order, key{p.model, p.class})
		}
	}
	for _, m := range models {
		cfg.Managed = append(cfg.Managed, fleetsim.ManagedConfig{Name: m.name + "-managed", Addr: "127.0.0.1:0", Model: m.name + "-managed",
			APIKey: managedKey, Latency: m.managedLatency, TimePerToken: m.perTok})
	}
	fl, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	e := &env{fl: fl, endpoints: map[string][]string{}, managed: map[string]*fleetsim.Managed{}, capacity: map[string]float64{},
		price: map[string]float64{}, speed: map[string]fleetsim.Hardware{}, client: &http.Client{Timeout: 10 * time.Minute}}
	var targets []fleet.Target
	for i, r := range fl.Replicas {
		k := order[i]
		e.endpoints[k.model+"/"+k.class] = append(e.endpoints[k.model+"/"+k.class], r.Addr())
		e.price[r.Addr()] = classPrice[k.class]
		e.speed[r.Addr()] = speedOf(k.model, k.class)
		targets = append(targets, fleet.Target{Addr: r.Addr(), Dialect: fleet.MustDialect("vllm")})
	}
	for _, p := range pools {
		e.capacity[p.model] += replicasPerPool * capacity(p.speed)
	}
	roots := x509.NewCertPool()
	for i, m := range fl.Managed {
		e.managed[models[i].name] = m
		roots.AppendCertsFromPEM(m.CertPEM)
	}
	e.tlsClient = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	// Engines are scraped every 100 ms of simulated time; staleness stays in real time.
	e.scraper = &fleet.Scraper{Interval: time.Duration(float64(100*time.Millisecond) * timeScale), StaleAfter: time.Second,
		OnRound: func() {
			if q := e.kick.Load(); q != nil {
				q.KickAll()
			}
		}}
	e.scraper.SetTargets(targets)
	go e.scraper.Run(ctx)
	select {
	case <-e.scraper.FirstRound():
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("the fleet's metrics did not arrive")
	}
	return e, nil
}

// snapshot parses the benchmark policy with a placement mode, the fallbacks' conditions and the admission queue
// on or off.
func (e *env) snapshot(placement, when string, queue bool) *policies.Snapshot {
	managed := map[string]string{}
	for name, m := range e.managed {
		managed[name] = m.Addr()
	}
	snap, err := policies.Parse("fleetbench.yaml", []byte(policyYAML(e.endpoints, managed, placement, when, queue)))
	if err != nil {
		log.Fatal(err)
	}
	return snap
}

// router builds a fresh router (cold index and in-flight counts) for a row.
func (e *env) router(name string) router {
	switch name {
	case "round-robin":
		return &roundRobin{eps: e.endpointsByModel()}
	case "least-loaded":
		snap := e.snapshot(policies.PlacementAffinity, policies.WhenSaturated, false)
		inflight := &fleet.InFlight{}
		return &pickerRouter{snap: snap, picker: &picker.LeastInFlight{InFlight: inflight}, inflight: inflight}
	case "infergate cost-blind":
		snap := e.snapshot(policies.PlacementAffinity, policies.WhenSaturated, false)
		inflight := &fleet.InFlight{}
		return &pickerRouter{snap: snap, picker: picker.NewAffinity(inflight, e.scraper), inflight: inflight}
	case fleetOnly:
		snap := e.snapshot(policies.PlacementSLO, "", true) // no fallback at all
		inflight := &fleet.InFlight{}
		q := &queuedRouter{pickerRouter: pickerRouter{snap: snap, picker: picker.NewAffinity(inflight, e.scraper), inflight: inflight},
			queue: admission.New(nil, nil)}
		e.kick.Store(q.queue)
		return q
	default:
		snap := e.snapshot(policies.PlacementSLO, policies.WhenSaturated+", "+policies.WhenSLO, false)
		inflight := &fleet.InFlight{}
		return &pickerRouter{snap: snap, picker: picker.NewAffinity(inflight, e.scraper), inflight: inflight}
	}
}

func speedOf(model, class string) fleetsim.Hardware {
	for _, p := range pools {
		if p.model == model && p.class == class {
			return p.speed
		}
	}
	log.Fatalf("no pool %s/%s", model, class)
	return fleetsim.Hardware{}
}

func (e *env) endpointsByModel() map[string][]string {
	out := map[string][]string{}
	for k, eps := range e.endpoints {
		model, _, _ := strings.Cut(k, "/")
		out[model] = append(out[model], eps...)
	}
	return out
}

// printBusy shows, per pool, how much of the run its replicas' engines were stepping (-v).
func (e *env) printBusy(r result) {
	keys := slices.Sorted(maps.Keys(e.endpoints))
	for _, k := range keys {
		fmt.Fprintf(os.Stderr, "  %-18s", k)
		for _, addr := range e.endpoints[k] {
			fmt.Fprintf(os.Stderr, " %5.1f%%", 100*float64(r.busy[addr])/float64(max(r.elapsed, 1)))
		}
		fmt.Fprintln(os.Stderr)
	}
}
