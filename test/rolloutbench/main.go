// Command rolloutbench measures the rollout gates' error rates: seeded rollouts of a candidate identical to
// the baseline (A/A) and of candidates with a fault — slower engines, errors, a TTFT-only and a TPOT-only
// regression — each through the real rollout.Controller with its default gates, on fleetsim engines in a
// discrete-event loop (simulated time, a fake clock for the controller). Every run draws its own noise: the
// load swings sinusoidally by 20-50 %, every engine step is jittered (log-normal, σ 5-15 %), and one replica
// of either arm has a noisy neighbour that slows its steps by 1.2-1.5× for 5-20 s of every 40-80 s. The
// candidate's replicas follow its share (a canary that scales with its weight), except in the fixed-pools
// rows, where each arm keeps two whatever the share (unequal loads per engine). The report: per fault, the
// share of runs rolled back, and the candidate requests and time until the rollback; the targets
// printed met / not met.
//
//	go run ./test/rolloutbench [-aa 200] [-runs 100] [-seed 1]
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

func main() {
	aa := flag.Int("aa", 200, "A/A rollouts")
	runs := flag.Int("runs", 100, "rollouts of each fault")
	seed := flag.Uint64("seed", 1, "first seed: run k of a row uses seed+k")
	only := flag.String("only", "", "run only the rows whose name contains this")
	parallel := flag.Int("parallel", runtime.GOMAXPROCS(0), "rollouts run at once")
	verbose := flag.Bool("v", false, "print every rollout's end")
	flag.Parse()
	start := time.Now()
	dir, err := os.MkdirTemp("", "rolloutbench")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	fmt.Printf("Rollouts through rollout.Controller with its default gates (confidence 0.99, latency ratios 1.2, output ratio 2, error increase 0.01, unfinished increase 0.02 (8 %% of both arms' answers cut at max tokens), goodput ratio 0.95, 50 requests an arm, 30 s warm-up); steps 10/30/50/100 %% of %d replicas, 2 simulated minutes and 200 candidate requests each; 55-75 requests/s.\n\n", replicas)
	fmt.Println("| candidate | runs | rolled back | candidate requests to rollback: median (p10-p90) | simulated time to rollback: median | rollback reasons |")
	fmt.Println("|---|---|---|---|---|---|")
	var rows []row
	for _, f := range faults {
		if *only != "" && !strings.Contains(f.name, *only) {
			continue
		}
		n := *runs
		if strings.HasPrefix(f.name, "A/A") {
			n = *aa
		}
		r := runRow(dir, f, n, *seed, *parallel, *verbose)
		rows = append(rows, r)
		fmt.Println(r.line())
	}
	fmt.Println()
	targets(rows)
	fmt.Printf("\nRan in %s.\n", time.Since(start).Round(time.Second))
}

// row is one fault's runs.
type row struct {
	f        fault
	outcomes []outcome
	errs     []error
}

func runRow(dir string, f fault, n int, seed uint64, parallel int, verbose bool) row {
	r := row{f: f, outcomes: make([]outcome, n)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, parallel))
	for k := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o, err := runOne(dir, f, seed+uint64(k))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.errs = append(r.errs, err)
				return
			}
			r.outcomes[k] = o
			if verbose {
				fmt.Fprintf(os.Stderr, "%s seed %d: rolled back %v at step %d, %v, %d candidate requests: %s\n", f.name, seed+uint64(k),
					o.rolledBack, o.step+1, o.at, o.candidateRequests, o.reason)
			}
		}()
	}
	wg.Wait()
	return r
}

func (r row) rolledBack() (n int, requests []int, at []time.Duration, reasons map[string]int) {
	reasons = map[string]int{}
	for _, o := range r.outcomes {
		if !o.rolledBack {
			continue
		}
		n++
		requests, at = append(requests, o.candidateRequests), append(at, o.at)
		gate, _, _ := strings.Cut(o.reason, " ")
		reasons[gate]++
	}
	return n, requests, at, reasons
}

func (r row) rate() float64 {
	n, _, _, _ := r.rolledBack()
	return float64(n) / float64(len(r.outcomes))
}

func (r row) line() string {
	n, requests, at, reasons := r.rolledBack()
	if len(r.errs) > 0 {
		return fmt.Sprintf("| %s | %d | %d runs failed: %v | | | |", r.f.name, len(r.outcomes), len(r.errs), r.errs[0])
	}
	reqs, when := "-", "-"
	if n > 0 {
		slices.Sort(requests)
		slices.Sort(at)
		reqs = fmt.Sprintf("%d (%d-%d)", requests[n/2], requests[n/10], requests[min(n-1, n*9/10)])
		when = at[n/2].Round(time.Second).String()
	}
	var why []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range reasons {
			if !yield(k) {
				return
			}
		}
	}) {
		why = append(why, fmt.Sprintf("%s %d", k, reasons[k]))
	}
	return fmt.Sprintf("| %s | %d | %d (%.1f %%) | %s | %s | %s |", r.f.name, len(r.outcomes), n, 100*r.rate(), reqs, when, strings.Join(why, ", "))
}

// targets prints the targets, met or not.
func targets(rows []row) {
	want := map[string]struct {
		atLeast bool
		share   float64
	}{
		"A/A (none)": {false, 0.01}, "slowdown 2×": {true, 0.99}, "slowdown 3×": {true, 0.99}, "errors 20 %": {true, 0.99},
		"slowdown 1.5×": {true, 0.90}, "errors 5 %": {true, 0.90},
		"cut at max tokens +10 points": {true, 0.90}, // the finish-reason gate's own target
		// Arms of unequal load per engine, compared at the same load (docs/rollouts.md).
		"A/A, fixed pools of 2 + 2": {false, 0.01}, "slowdown 1.5×, fixed pools of 2 + 2": {true, 0.90},
	}
	fmt.Println("Targets:")
	for _, r := range rows {
		w, ok := want[r.f.name]
		if !ok {
			continue
		}
		met := r.rate() <= w.share
		what := "false rollbacks"
		cmp := "≤"
		if w.atLeast {
			met, what, cmp = r.rate() >= w.share, "detected", "≥"
		}
		verdict := "met"
		if !met || len(r.errs) > 0 {
			verdict = "NOT MET"
		}
		fmt.Printf("- %s: %s %.1f %% %s %.0f %%: %s\n", r.f.name, what, 100*r.rate(), cmp, 100*w.share, verdict)
	}
}
