// Command scrapebench measures what keeping the fleet's state costs (issue #19): R gateway replicas reading
// E simulated engines every 100 ms, each scraping on its own and then through the relay (one replica holds a
// lease in a real redis-server, scrapes and publishes each round; the others take its readings). The engines
// run in their own process (infergate-sim) so that the two sides' CPU is measured apart, from /proc.
//
//	go run ./test/scrapebench -engines 200 -gateways 20
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/relay"
	"github.com/infergate/infergate/test/loadgen"
)

const interval = 100 * time.Millisecond

func main() {
	engines := flag.Int("engines", 200, "simulated engines")
	gateways := flag.Int("gateways", 20, "gateway replicas")
	window := flag.Duration("window", 10*time.Second, "measured time per mode")
	runs := flag.Int("runs", 3, "runs per mode; the table shows medians")
	flag.Parse()
	dir, err := os.MkdirTemp("", "scrapebench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sim, addrs := startSim(ctx, dir, *engines)
	redisAddr, redisPID := startRedis(ctx, dir)
	fmt.Printf("%d engines (infergate-sim, pid %d), %d gateway replicas in this process, scrape interval %v, %v measured per run, medians of %d\n\n",
		len(addrs), sim, *gateways, interval, *window, *runs)
	var targets []fleet.Target
	for _, a := range addrs {
		targets = append(targets, fleet.Target{Addr: a, Dialect: fleet.MustDialect("vllm")})
	}
	results := map[string][]result{}
	for range *runs {
		for _, mode := range []string{"each replica scrapes", "relay"} {
			results[mode] = append(results[mode], measure(ctx, mode == "relay", targets, *gateways, *window, sim, redisPID, redisAddr))
		}
	}
	fmt.Println("| mode | engine scrapes/s | per engine | rounds/s per replica (of 10) | gateway CPU (cores) | per replica | engine-side CPU (cores) | Redis CPU (cores) | reading age p50 | p99 |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	med := map[string]result{}
	for _, mode := range []string{"each replica scrapes", "relay"} {
		r := medianOf(results[mode])
		med[mode] = r
		fmt.Printf("| %s | %.0f | %.1f | %.1f | %.2f | %.3f | %.2f | %.3f | %.0f ms | %.0f ms |\n", mode, r.scrapes, r.scrapes/float64(len(addrs)),
			r.rounds, r.gatewayCPU, r.gatewayCPU/float64(*gateways), r.engineCPU, r.redisCPU, r.ageP50, r.ageP99)
	}
	each, rel := med["each replica scrapes"], med["relay"]
	perScrape := each.gatewayCPU / max(each.scrapes, 1)
	fmt.Printf("\nGateway CPU per scrape, each replica scraping: %.0f µs; at the nominal %d scrapes/s that is %.2f cores per replica.\n",
		1e6*perScrape, len(addrs)*10, perScrape*float64(len(addrs))*10)
	fmt.Println("\nTargets:")
	loadgen.Check("relay: scrapes per engine grow with the engines, not the replicas (≤ 1.2 × 10/s)", rel.scrapes/float64(len(addrs)) <= 12,
		"%.1f/s per engine (each replica scraping: %.1f/s)", rel.scrapes/float64(len(addrs)), each.scrapes/float64(len(addrs)))
	loadgen.Check("relay: readings no staler than each replica scraping (p99 within one interval)", rel.ageP99 <= each.ageP99+float64(interval/time.Millisecond),
		"p99 %.0f ms against %.0f ms", rel.ageP99, each.ageP99)
	// CPU for what it buys: a replica's round of fresh readings (on this machine, replicas scraping on their
	// own may not manage the nominal ten rounds a second).
	perRound := func(r result) float64 { return r.gatewayCPU / max(r.rounds*float64(*gateways), 1e-9) }
	loadgen.Check("relay: gateway CPU per replica round at most half of each replica scraping", perRound(rel) <= perRound(each)/2,
		"%.2f ms against %.2f ms (%.2f against %.2f cores in all)", 1e3*perRound(rel), 1e3*perRound(each), rel.gatewayCPU, each.gatewayCPU)
}

type result struct {
	scrapes, rounds                 float64 // engine scrapes per second in all; rounds per second per replica
	gatewayCPU, engineCPU, redisCPU float64 // cores
	ageP50, ageP99                  float64 // ms
}

// measure runs the replicas for window and reports what the engines, this process and Redis spent.
func measure(parent context.Context, viaRelay bool, targets []fleet.Target, n int, window time.Duration, sim, redisPID int, redisAddr string) result {
	ctx, cancel := context.WithCancel(parent)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var scrapers []*fleet.Scraper
	counts := make([]*roundCounter, n)
	for i := range n {
		counts[i] = &roundCounter{}
		s := &fleet.Scraper{Interval: interval, OnRound: counts[i].tick, Client: &http.Client{Timeout: interval, Transport: counts[i]}}
		s.SetTargets(targets)
		if viaRelay {
			client := redis.NewClient(&redis.Options{Addr: redisAddr})
			defer func() { _ = client.Close() }()
			r := relay.New(relay.Options{Client: client, Scraper: s, Interval: interval})
			s.Relay = r
			wg.Go(func() { r.Run(ctx) })
		}
		scrapers = append(scrapers, s)
		wg.Go(func() { s.Run(ctx) })
	}
	// Warm up: every replica reads every engine, and the relay has a leader.
	deadline := time.Now().Add(30 * time.Second)
	for !allFresh(scrapers, targets) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // a benchmark's warm-up, not a test's synchronisation
	}
	time.Sleep(2 * time.Second)
	self0, sim0, redis0 := cpu(os.Getpid()), cpu(sim), cpu(redisPID)
	scraped0 := sumScrapes(counts)
	rounds0 := sumRounds(counts)
	start := time.Now()
	var ages []float64
	tick := time.NewTicker(37 * time.Millisecond)
	for time.Since(start) < window {
		<-tick.C
		now := time.Now()
		for _, s := range scrapers {
			m, _ := s.Metrics(targets[int(now.UnixNano()/1000)%len(targets)].Addr)
			if m.At.IsZero() { // never read yet: as old as the measurement
				m.At = start
			}
			ages = append(ages, float64(now.Sub(m.At))/1e6)
		}
	}
	tick.Stop()
	secs := time.Since(start).Seconds()
	r := result{
		scrapes:    float64(sumScrapes(counts)-scraped0) / secs,
		rounds:     float64(sumRounds(counts)-rounds0) / secs / float64(n),
		gatewayCPU: (cpu(os.Getpid()) - self0) / secs,
		engineCPU:  (cpu(sim) - sim0) / secs,
		redisCPU:   (cpu(redisPID) - redis0) / secs,
	}
	slices.Sort(ages)
	r.ageP50, r.ageP99 = ages[len(ages)/2], ages[len(ages)*99/100]
	return r
}

// roundCounter counts a replica's rounds (its own and relayed ones) and the engine scrapes it made itself
// (its HTTP client's requests).
type roundCounter struct {
	mu              sync.Mutex
	rounds, scrapes int64
}

func (c *roundCounter) tick() { c.mu.Lock(); c.rounds++; c.mu.Unlock() }

func (c *roundCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.scrapes++
	c.mu.Unlock()
	return transport.RoundTrip(req)
}

var transport = &http.Transport{MaxIdleConnsPerHost: 4}

func sumRounds(cs []*roundCounter) int64 {
	return sumOf(cs, func(c *roundCounter) int64 { return c.rounds })
}

func sumScrapes(cs []*roundCounter) int64 {
	return sumOf(cs, func(c *roundCounter) int64 { return c.scrapes })
}

func sumOf(cs []*roundCounter, field func(*roundCounter) int64) int64 {
	var n int64
	for _, c := range cs {
		c.mu.Lock()
		n += field(c)
		c.mu.Unlock()
	}
	return n
}

func allFresh(ss []*fleet.Scraper, ts []fleet.Target) bool {
	for _, s := range ss {
		for _, t := range ts {
			if _, fresh := s.Metrics(t.Addr); !fresh {
				return false
			}
		}
	}
	return true
}

// cpu is a process's user + system CPU seconds so far, from /proc/<pid>/stat.
func cpu(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		log.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// startSim builds and runs infergate-sim with n engines on free ports and returns its pid and their addresses.
func startSim(ctx context.Context, dir string, n int) (int, []string) {
	var b strings.Builder
	b.WriteString("timeScale: 1\nreplicas:\n")
	for i := range n {
		fmt.Fprintf(&b, "- {name: e%d, addr: \"127.0.0.1:0\", model: m, hardware: l40s, numGPUBlocks: 4096, maxNumSeqs: 64}\n", i)
	}
	cfg := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	bin := filepath.Join(dir, "infergate-sim")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/infergate-sim").CombinedOutput(); err != nil {
		log.Fatalf("building infergate-sim: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, bin, "-fleet", cfg)
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	var addrs []string
	sc := bufio.NewScanner(out)
	for len(addrs) < n && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "replica" {
			addrs = append(addrs, strings.TrimPrefix(f[2], "http://"))
		}
	}
	if len(addrs) < n {
		log.Fatalf("infergate-sim started %d of %d engines", len(addrs), n)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd.Process.Pid, addrs
}

// startRedis runs redis-server on a free loopback port (persistence off) and returns its address and pid.
func startRedis(ctx context.Context, dir string) (string, int) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.CommandContext(ctx, "redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		log.Fatalf("redis-server (make test installs it): %v", err)
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer func() { _ = client.Close() }()
	for range 100 {
		if client.Ping(ctx).Err() == nil {
			return addr, cmd.Process.Pid
		}
		time.Sleep(50 * time.Millisecond) // a benchmark waiting for its server, not a test's synchronisation
	}
	log.Fatal("redis-server did not answer")
	return "", 0
}

// medianOf takes each figure's median over runs.
func medianOf(rs []result) result {
	med := func(f func(result) float64) float64 { return loadgen.Median(rs, f) }
	return result{scrapes: med(func(r result) float64 { return r.scrapes }), rounds: med(func(r result) float64 { return r.rounds }),
		gatewayCPU: med(func(r result) float64 { return r.gatewayCPU }), engineCPU: med(func(r result) float64 { return r.engineCPU }),
		redisCPU: med(func(r result) float64 { return r.redisCPU }), ageP50: med(func(r result) float64 { return r.ageP50 }),
		ageP99: med(func(r result) float64 { return r.ageP99 })}
}
