package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/director"
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
		"quota: {requestsPerSecond: 100000, tokensPerMinute: 10000000000, maxConcurrent: 1000, monthlySpendUSD: 1000000}", 1)
	snap, err := policies.Parse(policyPath, []byte(text))
	if err != nil {
		log.Fatal(err)
	}
	// The same policy with leases off: every request asks Redis.
	off := regexp.MustCompile(`(?m)^    leaseFraction:.*$`).ReplaceAllString(text, "")
	noLeases, err := policies.Parse(policyPath, []byte(strings.Replace(off, "  quotas:\n", "  quotas:\n    leaseFraction: 0\n", 1)))
	if err != nil || noLeases.LeaseFraction() != 0 {
		log.Fatalf("policy without leases: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	without, stopA := startProcessor(extproc.New(extproc.Options{Policies: policies.NewStaticStore(snap)}))
	defer stopA()
	// Three "with" processors: quotas with leases (the default), quotas with every request asking Redis,
	// and a second processor without quotas — an A/A control that shows the machine's noise floor.
	type variant struct {
		name    string
		limiter *quota.Limiter
		client  extprocv3.ExternalProcessorClient
	}
	variants := map[string]*variant{}
	for _, v := range []struct {
		name   string
		policy *policies.Snapshot // nil: no quotas
	}{{"leases", snap}, {"no leases", noLeases}, {"none (A/A)", nil}} {
		opts := extproc.Options{Policies: policies.NewStaticStore(snap)}
		var limiter *quota.Limiter
		if v.policy != nil {
			limiter = quota.New(ctx, quota.Options{Addrs: []string{addr}})
			store := policies.NewStaticStore(v.policy)
			opts = extproc.Options{Policies: store, Director: director.New(director.Options{Policies: store, Admission: limiter})}
		}
		client, stop := startProcessor(extproc.New(opts))
		defer stop()
		variants[v.name] = &variant{name: v.name, limiter: limiter, client: client}
	}

	fmt.Printf("\nQuotas (requests/s, tokens/min, concurrency, monthly spend checked per request; Redis %s on loopback), %d runs per row (medians):\n\n", redisVersion(rdb), runs)
	fmt.Println("| prompt | body mode | concurrency | quotas | p50 without | p99 without | p50 with | p99 with | added p50 | added p99 | Redis round trips / request | Redis commands / request |")
	fmt.Println("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	c1 := config{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_BUFFERED, concurrency: 1, requests: int(2000 * scale)}
	c32 := config{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_BUFFERED, concurrency: 32, requests: int(4000 * scale)}
	fd32 := config{promptBytes: 2 << 10, mode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, concurrency: 32, requests: int(4000 * scale)}
	for _, row := range []struct {
		config
		variant string
	}{
		{c1, "leases"}, {c32, "leases"}, {fd32, "leases"},
		{c1, "no leases"}, {c32, "no leases"},
		{c1, "none (A/A)"}, {c32, "none (A/A)"}, {fd32, "none (A/A)"},
	} {
		cfg, v := row.config, variants[row.variant]
		body := chatBody(cfg.promptBytes)
		var a, b []result
		var added50, added99 []time.Duration
		var trips, cmds, n int64
		for range runs {
			r, err := measure(without, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			a = append(a, r)
			time.Sleep(20 * time.Millisecond) // let settlements of the previous run drain
			var t0 int64
			if v.limiter != nil {
				t0 = v.limiter.RoundTrips()
			}
			c0 := commandCalls(rdb)
			r, err = measure(v.client, cfg, body, chunk)
			if err != nil {
				log.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			if v.limiter != nil {
				trips += v.limiter.RoundTrips() - t0
			}
			cmds += commandCalls(rdb) - c0 - 1 // the INFO call itself
			n += int64(cfg.requests + 20)      // measure() warms up with 20 requests
			// Added latency per pair of back-to-back runs, which share the machine's state of the moment.
			added50 = append(added50, r.p50-a[len(a)-1].p50)
			added99 = append(added99, r.p99-a[len(a)-1].p99)
			b = append(b, r)
		}
		ma, mb := medianResult(a), medianResult(b)
		fmt.Printf("| %d KiB | %s | %d | %s | %s | %s | %s | %s | %s | %s | %.2f | %.2f |\n", cfg.promptBytes>>10, modeName(cfg.mode), cfg.concurrency, v.name,
			fmtDur(ma.p50), fmtDur(ma.p99), fmtDur(mb.p50), fmtDur(mb.p99), fmtDur(medianDur(added50)), fmtDur(medianDur(added99)),
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

func medianDur(ds []time.Duration) time.Duration {
	return time.Duration(loadgen.Median(ds, func(d time.Duration) float64 { return float64(d) }))
}
