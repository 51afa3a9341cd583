package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/extproc"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/test/loadgen"
)

// benchQuotas measures what quota admission and settlement add to a decision: the same requests through two
// processors, with and without quotas, interleaved, with Redis on loopback.
func benchQuotas(policyPath string, runs int, scale float64, chunk int) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Println("\n(quota rows skipped: redis-server is not installed; `make test-deps` installs it)")
		return
	}
	addr, stop, err := loadgen.StartRedis()
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	data, err := os.ReadFile(policyPath)
	if err != nil {
		log.Fatal(err)
	}
	// Limits high enough that nothing is refused: the bench measures the cost of checking, not refusals. All
	// five kinds of limit are checked per request (tenant-wide), as in a real deployment.
	text := strings.Replace(string(data), "quota: {requestsPerSecond: 50, tokensPerMinute: 2000000, maxConcurrent: 64, monthlySpendUSD: 20000}",
		"quota: {requestsPerSecond: 1000000, tokensPerMinute: 1000000000000, maxConcurrent: 100000, monthlySpendUSD: 1000000000}", 1)
	snap, err := policies.Parse(policyPath, []byte(text))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	limiter := quota.New(ctx, quota.Options{Addrs: []string{addr}})
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	without, stopA := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(snap)}))
	defer stopA()
	with, stopB := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(snap), Quotas: limiter}))
	defer stopB()

	fmt.Printf("\nQuotas (requests/s, tokens/min, concurrency, monthly spend checked per request; Redis %s on loopback), %d runs per row (medians):\n\n", redisVersion(rdb), runs)
	fmt.Println("| prompt | body mode | concurrency | p50 without | p99 without | p50 with | p99 with | added p50 | added p99 | Redis round trips / request | Redis commands / request |")
	fmt.Println("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, cfg := range []config{
		{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_BUFFERED, concurrency: 1, requests: int(2000 * scale)},
		{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_BUFFERED, concurrency: 32, requests: int(4000 * scale)},
		{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, concurrency: 32, requests: int(4000 * scale)},
	} {
		body := chatBody(cfg.promptBytes)
		var a, b []result
		var trips, cmds, n int64
		for range runs {
			r, err := measure(without, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			a = append(a, r)
			time.Sleep(20 * time.Millisecond) // let settlements of the previous run drain
			t0, c0 := limiter.RoundTrips(), commandCalls(rdb)
			r, err = measure(with, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			trips += limiter.RoundTrips() - t0
			cmds += commandCalls(rdb) - c0 - 1 // the INFO call itself
			n += int64(cfg.requests + 20)      // measure() warms up with 20 requests
			b = append(b, r)
		}
		ma, mb := medianResult(a), medianResult(b)
		fmt.Printf("| %d KiB | %s | %d | %s | %s | %s | %s | %s | %s | %.2f | %.2f |\n", cfg.promptBytes>>10, modeName(cfg.mode), cfg.concurrency,
			fmtDur(ma.p50), fmtDur(ma.p99), fmtDur(mb.p50), fmtDur(mb.p99), fmtDur(mb.p50-ma.p50), fmtDur(mb.p99-ma.p99),
			float64(trips)/float64(n), float64(cmds)/float64(n))
	}
}

// commandCalls sums the calls of every command Redis has executed (INFO commandstats).
func commandCalls(rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		if i := strings.Index(line, "calls="); i >= 0 {
			rest := line[i+6:]
			if j := strings.IndexByte(rest, ','); j >= 0 {
				rest = rest[:j]
			}
			n, _ := strconv.ParseInt(rest, 10, 64)
			total += n
		}
	}
	return total
}

func redisVersion(rdb *redis.Client) string {
	info, _ := rdb.Info(context.Background(), "server").Result()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}
