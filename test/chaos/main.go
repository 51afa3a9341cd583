// Command chaos runs infergate's reliability suite (make chaos): the simulated fleet, infergate with Redis
// and the Envoy-faithful data plane on loopback under steady streaming load, with one fault injected at a time
// — replicas refusing, hanging and failing, pools down with and without a fallback, Redis killed and stopped
// in both fail modes, infergate terminated and killed and restarted, a broken policy, 3× overload and hostile
// inputs (requests, memory-heavy bodies, guessed keys, forged Redis placements). For each it prints requests, clear errors, lost requests (no response, a cut or unfinished
// stream), gateway crashes, recovery time and the worst tokens-per-minute overshoot; it exits 1 when anything
// is lost that the design does not accept, when the gateway crashes, or when a quota overshoots by more
// than 1 %.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

const (
	steadyWorkers = 16
	warmFor       = time.Second
	faultFor      = 5 * time.Second
	observeFor    = 5 * time.Second
	maxOvershoot  = 0.01
)

// row is one scenario's line in the table.
type row struct {
	name                         string
	from, to                     time.Time
	requests, clear, lost, cutOK int
	crashes                      int
	recovery                     time.Duration
	recovered                    bool
	overshoot                    float64
	problems                     []string
	errorKinds                   map[string]int // clear errors by status and code
}

func main() {
	only := flag.String("only", "", "run only the scenarios whose name matches this regular expression")
	verbose := flag.Bool("v", false, "log the stack's own messages")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, *only, *verbose, os.Stdout))
}

func run(ctx context.Context, only string, verbose bool, out io.Writer) (code int) {
	var filter *regexp.Regexp
	if only != "" {
		filter = regexp.MustCompile(only)
	}
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dir, err := os.MkdirTemp("", "infergate-chaos")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() {
		if code == 0 {
			_ = os.RemoveAll(dir)
			return
		}
		// A failed run keeps its logs (infergate's, Redis's, the audit log, the metered requests) for the
		// post-mortem; only the binary goes.
		_ = os.Remove(filepath.Join(dir, "infergate"))
		fmt.Fprintln(out, "logs kept in", dir)
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	started := time.Now()
	s, err := startStack(ctx, root, dir, log)
	if s != nil {
		defer s.shutdown()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: stack:", err, "(logs in", dir+")")
		return 2
	}
	l := newLoad(s)
	removeSteady := l.addSteady(steadyWorkers)
	l.startMetered()

	var rows []row
	for _, sc := range scenarios() {
		if filter != nil && !filter.MatchString(sc.name) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		r, err := runScenario(s, l, sc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %s: %v (logs in %s)\n", sc.name, err, dir)
			removeSteady()
			l.close()
			return 2
		}
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "chaos: %-30s done\n", sc.name)
	}
	removeSteady()
	l.close()
	attributeOvershoot(rows, l.all(), s.meteredTPM)
	if err := writeMetered(filepath.Join(dir, "metered.tsv"), l.all()); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
	}

	failed := printTable(out, rows)
	fmt.Fprintf(out, "\n%d scenarios in %s (%d steady streaming clients, one metered tenant at %d tokens/min)\n",
		len(rows), time.Since(started).Round(time.Second), steadyWorkers, s.meteredTPM)
	if failed {
		fmt.Fprintln(out, "FAIL")
		return 1
	}
	fmt.Fprintln(out, "PASS")
	return 0
}

// runScenario warms up, injects, holds, heals and observes, then accounts for the requests that started in
// that time.
func runScenario(s *stack, l *load, sc scenario) (row, error) {
	crashesBefore := s.crashCount()
	from := time.Now()
	time.Sleep(warmFor)
	inflight := l.workers.Load()
	if sc.inject != nil {
		if err := sc.inject(s, l); err != nil {
			return row{}, fmt.Errorf("inject: %w", err)
		}
	}
	hold := sc.hold
	if hold == 0 {
		hold = faultFor
	}
	time.Sleep(hold)
	healed := time.Now()
	if sc.heal != nil {
		if err := sc.heal(s, l); err != nil {
			return row{}, fmt.Errorf("heal: %w", err)
		}
	}
	time.Sleep(observeFor)
	to := time.Now()
	// Wait for the requests that started in the scenario, so it owns all its results.
	if err := waitFor(60*time.Second, "requests to finish", func() bool { return !l.runningSince(to) }); err != nil {
		return row{}, err
	}
	r := row{name: sc.name, crashes: s.crashCount() - crashesBefore, from: from, to: to, errorKinds: map[string]int{}}
	var lastFailure time.Time
	for _, res := range l.between(from, to) {
		if res.metered {
			continue
		}
		r.requests++
		switch res.outcome {
		case clearErr:
			r.clear++
			r.errorKinds[errorKind(res)]++
			if os.Getenv("CHAOS_DEBUG") != "" && r.errorKinds[errorKind(res)] == 1 {
				fmt.Fprintf(os.Stderr, "chaos: %s: first %s at +%s: %s\n", sc.name, errorKind(res), res.start.Sub(from).Round(time.Millisecond), res.detail)
			}
		case lostReq:
			r.lost++
			if len(r.problems) < 3 {
				r.problems = append(r.problems, "lost: "+res.detail)
			}
		}
		if res.outcome != ok && res.end.After(lastFailure) {
			lastFailure = res.end
		}
	}
	// Recovered: the last failure ended before the final second of observation; recovery is how long after
	// the fault ended it did (0 when nothing failed after it).
	r.recovered = lastFailure.Before(to.Add(-time.Second))
	r.recovery = max(0, lastFailure.Sub(healed))
	// Streams cut by a dying replica or gateway are the accepted losses: at most what was in flight.
	if sc.cutsStreams && r.lost <= int(inflight) {
		r.cutOK, r.lost = r.lost, 0
		r.problems = nil
	}
	if sc.check != nil {
		r.problems = append(r.problems, sc.check(s, l, from)...)
	}
	return r, nil
}

// errorKind names a clear error by its status and OpenAI code (or Envoy's reply).
func errorKind(r result) string {
	if m := limitRe.FindStringSubmatch(r.detail); m != nil {
		return fmt.Sprintf("%d %s", r.status, m[1]) // which quota
	}
	if m := codeRe.FindStringSubmatch(r.detail); m != nil {
		return fmt.Sprintf("%d %s", r.status, m[1])
	}
	d := r.detail
	if i := strings.IndexByte(d, ' '); i >= 0 && len(d) > i+1 {
		d = d[i+1:]
	}
	return fmt.Sprintf("%d %.40s", r.status, d)
}

var (
	codeRe  = regexp.MustCompile(`"code":\s*"([a-z_]+)"`)
	limitRe = regexp.MustCompile(`Rate limit reached for ([a-z ]+) `)
)

// attributeOvershoot sums the metered tenant's tokens per fixed minute window (by request start, as
// admission counts them) and gives each scenario the worst overshoot of the windows it overlaps.
func attributeOvershoot(rows []row, results []result, limit int64) {
	perWindow := map[int64]int64{}
	for _, r := range results {
		if r.metered && r.outcome == ok {
			perWindow[r.start.Unix()/60] += r.tokens
		}
	}
	for i := range rows {
		worst := -1.0
		for w, used := range perWindow {
			start, end := time.Unix(w*60, 0), time.Unix((w+1)*60, 0)
			if start.Before(rows[i].to) && end.After(rows[i].from) {
				worst = max(worst, float64(used)/float64(limit)-1)
			}
		}
		rows[i].overshoot = worst
	}
}

// writeMetered writes the metered tenant's requests as the client saw them (start, end, status, tokens), for
// comparing a window's overshoot with the gateway's audit log.
func writeMetered(path string, results []result) error {
	var b strings.Builder
	b.WriteString("start\tend\tstatus\ttokens\n")
	for _, r := range results {
		if r.metered {
			fmt.Fprintf(&b, "%s\t%s\t%d\t%d\n", r.start.Format(time.RFC3339Nano), r.end.Format(time.RFC3339Nano), r.status, r.tokens)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func printTable(out io.Writer, rows []row) (failed bool) {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\trequests\tclear errors\tlost\tcut (accepted)\tcrashes\trecovery\tworst TPM window\tresult")
	for _, r := range rows {
		rec := "-"
		if r.recovered {
			rec = r.recovery.Round(10 * time.Millisecond).String()
		}
		verdict := "ok"
		if r.lost > 0 || r.crashes > 0 || len(r.problems) > 0 || !r.recovered || r.overshoot > maxOvershoot {
			verdict, failed = "FAIL", true
		}
		tpm := "-"
		if r.overshoot > -1 {
			tpm = fmt.Sprintf("%.1f%% of limit", 100*(1+r.overshoot))
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.name, r.requests, r.clear, r.lost, r.cutOK, r.crashes, rec, tpm, verdict)
	}
	_ = w.Flush()
	worst := 0.0
	for _, r := range rows {
		worst = max(worst, r.overshoot)
	}
	verdict := "ok"
	if worst > maxOvershoot {
		verdict, failed = "FAIL", true
	}
	fmt.Fprintf(out, "\nquota: worst tokens-per-minute window at %+.2f%% of its limit (allowed +%.0f%%): %s\n", 100*worst, 100*maxOvershoot, verdict)
	var problems []string
	for _, r := range rows {
		for _, p := range r.problems {
			problems = append(problems, r.name+": "+p)
		}
		if !r.recovered {
			problems = append(problems, r.name+": requests still failed at the end of the observation")
		}
	}
	fmt.Fprintln(out, "\nclear errors by kind:")
	for _, r := range rows {
		if len(r.errorKinds) == 0 {
			continue
		}
		kinds := make([]string, 0, len(r.errorKinds))
		for k, n := range r.errorKinds {
			kinds = append(kinds, fmt.Sprintf("%s ×%d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(out, "  %s: %s\n", r.name, strings.Join(kinds, ", "))
	}
	sort.Strings(problems)
	if len(problems) > 0 {
		fmt.Fprintln(out, "\nproblems:\n  "+strings.Join(problems, "\n  "))
	}
	return failed
}

// shutdown stops the processes the stack started.
func (s *stack) shutdown() {
	if s.gateway != nil && !s.gateway.exited() {
		s.stopGateway(syscall.SIGKILL)
	}
	if s.redis != nil && !s.redis.exited() {
		s.redis.signal(syscall.SIGCONT)
		s.redis.signal(syscall.SIGKILL)
		<-s.redis.done
	}
}
