// Command placementbench judges placement over a family of generated fleets and workloads instead of one: each
// scenario draws 2-4 hardware classes (speeds and prices arranged so that the fast class is the cheaper per
// token in some, the slow one in others, the cheaper one meets the TTFT target only for cached prompts in
// others, and one class cannot hold the model's context in others), a 7B-70B model, group sizes of 1-64,
// shared-prefix shares of 0-90 % and loads of 0.3-1.5× the fleet's capacity, constant or ramped; each runs
// several arrival seeds under round-robin, least-loaded, infergate's affinity, SLO placement, and SLO
// placement with the admission queue. The fleet is fleetsim's engine (fleetsim.VirtualEngine) in a
// discrete-event loop: simulated time, so the figures do not depend on the machine's load, and the family
// runs in minutes. The report is the distribution over scenarios, and the targets met / not met.
//
// With -pd it runs the P/D bench instead (make bench-pd, pd.go): a fleet of H200s and L40S pairs serving chat
// and bursts of long prompts aggregated, split at a fixed ratio, and by infergate's per-request choice; with
// -pd-family, on a family of generated fleets too.
//
//	go run ./test/placementbench [-quick]
//	go run ./test/placementbench -pd [-seeds 5] [-pd-placements slo,affinity] [-pd-family 12]
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

func main() {
	n := flag.Int("scenarios", 24, "scenarios in the family")
	seeds := flag.Int("seeds", 3, "arrival seeds per scenario")
	familySeed := flag.Uint64("family", 33, "seed the family of scenarios is drawn from")
	duration := flag.Duration("duration", 60*time.Second, "simulated length of each run")
	quick := flag.Bool("quick", false, "a CI-sized family: 8 scenarios, 1 seed, 20 s runs")
	only := flag.String("policies", "", "run only these rows (comma-separated; round-robin and affinity always run)")
	verbose := flag.Bool("v", false, "print every scenario's rows")
	parallel := flag.Int("parallel", runtime.GOMAXPROCS(0), "scenarios run at once")
	pick := flag.Int("scenario", -1, "run only this scenario of the family (with -v: its rows' class shares)")
	misstate := flag.Float64("misstate", 1, "an operator's wrong speeds: the policy states every other class's prefill and decode speeds this many times their real ones, the rest this many times slower")
	lag := flag.Duration("lag", 0, "a starved gateway: the mean of its own delays (exponential) before a request reaches its engine and in each TTFT it measures, which its picker learns from")
	gateways := flag.Int("gateways", 1, "gateway replicas sharing each fleet, taking requests in turn and sharing their placements; the queue row runs only with one")
	pd := flag.Bool("pd", false, "run the P/D bench instead (make bench-pd): aggregated, disaggregated at a fixed ratio and the per-request choice over a sweep of chat rates")
	pdRates := flag.String("pd-rates", "4,8,12,16,20,24,28,32,36,40", "the P/D bench's chat rates, requests a second: past the base fleet's capacity (about 30), where aggregated serving first misses its SLO")
	pdPlacements := flag.String("pd-placements", "slo,affinity", "the P/D bench's routing.placement for every row, one table each")
	pdFleets := flag.Int("pd-family", 0, "also run the P/D bench on this many fleets drawn from -family (H200s, L40S pairs, link), one summary table per placement")
	flag.Parse()
	if *pd {
		start := time.Now()
		for pl := range strings.SplitSeq(*pdPlacements, ",") {
			runPD(strings.TrimSpace(pl), parseRates(*pdRates), *seeds, *duration, *gateways)
		}
		if *pdFleets > 0 {
			fleets := pdFamily(*pdFleets, *familySeed)
			for pl := range strings.SplitSeq(*pdPlacements, ",") {
				runPDFamily(fleets, strings.TrimSpace(pl), parseRates(*pdRates), *seeds, *duration, *parallel, *gateways)
			}
		}
		fmt.Printf("\nRan in %s.\n", time.Since(start).Round(time.Second))
		return
	}
	if *quick {
		*n, *seeds, *duration = 8, 1, 20*time.Second
	}
	start := time.Now()
	family := make([]scenario, *n)
	for i := range family {
		family[i] = generate(i, *familySeed)
		family[i].lag, family[i].misstate, family[i].gateways = *lag, *misstate, *gateways
	}
	if *pick >= 0 && *pick < *n {
		family = family[*pick : *pick+1]
	}
	fmt.Printf("Family: %d scenarios (seed %d) × %d arrival seeds, %s of simulated time each", *n, *familySeed, *seeds, *duration)
	if *lag > 0 {
		fmt.Printf("; a starved gateway, its own delays %s on average", *lag)
	}
	if *gateways > 1 {
		fmt.Printf("; %d gateway replicas sharing placements", *gateways)
	}
	if *misstate != 1 {
		fmt.Printf("; the policy states the classes' speeds %g× and 1/%g× their real ones in turn", *misstate, *misstate)
	}
	fmt.Print(".\n\n")
	fmt.Println("| # | kind | model | classes (replicas, price, prefill, $ per 1M output at full batch, KV) | SLO | sharing | load | capacity |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for i := range family {
		fmt.Printf("| %s |\n", family[i].describe())
	}
	selected := make([]string, 0, len(rows))
	for _, r := range rows {
		if r == rowQueue && *gateways > 1 {
			continue // one admission queue per replica is not simulated
		}
		if r == rowRR || r == rowAffinity || loadgen.Selected(*only, r, rowRR) {
			selected = append(selected, r)
		}
	}
	results := make([]scenarioResult, len(family))
	inParallel(len(family), *parallel, func(i int) {
		results[i] = runScenario(&family[i], selected, *seeds, *duration, *lag)
		if *verbose {
			fmt.Fprintln(os.Stderr, results[i].line(true))
		}
	})
	report(family, results, selected)
	fmt.Printf("\nRan in %s.\n", time.Since(start).Round(time.Second))
}

// inParallel calls f(0) … f(n−1), at most limit at a time, and returns when every call has.
func inParallel(n, limit int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, limit))
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// runScenario runs every row on every arrival seed of one scenario.
func runScenario(sc *scenario, selected []string, seeds int, d, lag time.Duration) scenarioResult {
	res := scenarioResult{sc: sc, rows: map[string]*rowResult{}}
	for k := range seeds {
		work := sc.workload(d, uint64(k+1))
		for _, row := range selected {
			g := newGateway(sc, row, lag, uint64(k+1))
			out := g.run(work, d)
			r := res.rows[row]
			if r == nil {
				r = &rowResult{classShare: make([]float64, len(sc.classes))}
				res.rows[row] = r
			}
			r.add(out, g.fleet.cost(), g.decide, sc.ttft, sc.tpot)
		}
	}
	return res
}

// parseRates reads a comma-separated list of rates.
func parseRates(s string) []float64 {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "placementbench: bad rate %q\n", f)
			os.Exit(2)
		}
		out = append(out, v)
	}
	return out
}
