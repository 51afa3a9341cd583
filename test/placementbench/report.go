package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// rowResult is one row's figures in one scenario, pooled over its arrival seeds.
type rowResult struct {
	requests, good, served int
	usd                    float64 // engine time at the classes' prices
	completion, goodTokens int64
	prompt, cached         int64
	classShare             []float64 // requests served per class
	classes                []classFigures
	decisionP99            []time.Duration
}

func (r *rowResult) add(out []outcome, usd float64, decide []time.Duration, ttft, tpot time.Duration) {
	r.requests += len(out)
	r.usd += usd
	for _, o := range out {
		if !o.served {
			continue
		}
		r.served++
		r.completion += int64(o.completion)
		r.prompt += int64(o.prompt)
		r.cached += int64(o.cached)
		r.classShare[o.class]++
		if r.classes == nil {
			r.classes = make([]classFigures, len(r.classShare))
		}
		r.classes[o.class].add(o, ttft, tpot)
		if o.good {
			r.good++
			r.goodTokens += int64(o.completion)
		}
	}
	if len(decide) > 0 {
		r.decisionP99 = append(r.decisionP99, loadgen.Quantile(decide, 0.99))
	}
}

// goodput is the share of requests served within the SLO.
func (r *rowResult) goodput() float64 { return float64(r.good) / float64(max(1, r.requests)) }

// perMOut and perMGood are USD per 1M output tokens, and per 1M output tokens of good requests.
func (r *rowResult) perMOut() float64  { return r.usd / float64(max(1, r.completion)) * 1e6 }
func (r *rowResult) perMGood() float64 { return r.usd / float64(max(1, r.goodTokens)) * 1e6 }

func (r *rowResult) hit() float64 { return float64(r.cached) / float64(max(1, r.prompt)) }

// scenarioResult is every row of one scenario.
type scenarioResult struct {
	sc   *scenario
	rows map[string]*rowResult
}

func (s scenarioResult) line(verbose bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| %d | %s |", s.sc.id, kindNames[s.sc.kind])
	for _, row := range rows {
		if r, ok := s.rows[row]; ok {
			fmt.Fprintf(&b, " %.1f%% $%.3f hit %.2f |", 100*r.goodput(), r.perMGood(), r.hit())
			if verbose {
				fmt.Fprintf(&b, " (not served %d; by class", r.requests-r.served)
				for _, n := range r.classShare {
					fmt.Fprintf(&b, " %.0f%%", 100*n/float64(max(1, r.served)))
				}
				b.WriteString(")")
				for i := range r.classes {
					fmt.Fprintf(&b, "\n    class %d: %s", i, r.classes[i].String())
				}
				b.WriteString(" |")
			}
		} else {
			b.WriteString(" – |")
		}
	}
	return b.String()
}

// dist is a figure's distribution over scenarios.
type dist struct{ median, p10, worst float64 }

// spread takes the median, the 10th percentile and the worst of vs, worst being the lowest when lowWorst, the
// highest otherwise.
func spread(vs []float64, lowWorst bool) dist {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s) == 0 {
		return dist{}
	}
	at := func(q float64) float64 { return s[min(len(s)-1, int(math.Floor(q*float64(len(s)-1)+0.5)))] }
	if lowWorst {
		return dist{at(0.5), at(0.1), s[0]}
	}
	return dist{at(0.5), at(0.9), s[len(s)-1]}
}

func report(family []scenario, results []scenarioResult, selected []string) {
	fmt.Println("\nPer scenario, pooled over its arrival seeds: goodput (share of requests within the SLO), $ per 1M good output tokens, cache-hit rate.")
	fmt.Printf("\n| # | kind | %s |\n|---|---|%s\n", strings.Join(rows, " | "), strings.Repeat("---|", len(rows)))
	for _, s := range results {
		fmt.Println(s.line(false))
	}
	fmt.Println("\nOver the family, per row (median / 10th percentile / worst over scenarios; cost: the worst is the highest):")
	fmt.Println("\n| row | goodput − affinity's (pts) | goodput ÷ round-robin's | $ per 1M output ÷ affinity's | $ per 1M good output ÷ affinity's | wins on goodput and cost | decision p99 (median of runs) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for _, row := range selected {
		var dGood, rGood, rCost, rGoodCost []float64
		wins := 0
		var decide []time.Duration
		for _, s := range results {
			r, a, rr := s.rows[row], s.rows[rowAffinity], s.rows[rowRR]
			dGood = append(dGood, 100*(r.goodput()-a.goodput()))
			rGood = append(rGood, r.goodput()/max(rr.goodput(), 1e-9))
			rCost = append(rCost, r.perMOut()/a.perMOut())
			rGoodCost = append(rGoodCost, r.perMGood()/a.perMGood())
			if r.goodput() >= a.goodput() && r.perMGood() <= a.perMGood() {
				wins++
			}
			decide = append(decide, r.decisionP99...)
		}
		g, rg, c, gc := spread(dGood, true), spread(rGood, true), spread(rCost, false), spread(rGoodCost, false)
		p99 := "–"
		if len(decide) > 0 {
			p99 = fmt.Sprintf("%.0f µs", float64(loadgen.Quantile(decide, 0.5))/1e3)
		}
		fmt.Printf("| %s | %+.1f / %+.1f / %+.1f | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %d of %d | %s |\n", row,
			g.median, g.p10, g.worst, rg.median, rg.p10, rg.worst, c.median, c.p10, c.worst, gc.median, gc.p10, gc.worst, wins, len(results), p99)
	}
	for _, row := range []string{rowSLO, rowQueue} {
		if slices.Contains(selected, row) {
			targets(results, row)
		}
	}
	if slices.Contains(selected, rowSLO) {
		decisionCost(results)
	}
}

// fisherBelow is the one-sided p-value of Fisher's exact test that row r serves fewer of its requests within
// the SLO than row o: the chance, were both alike, that r would hold at least its share of their misses. A
// failing comparison prints it, so that a shortfall of a request or two can be told from a real one.
func fisherBelow(r, o *rowResult) float64 {
	return loadgen.FisherMore(r.requests-r.good, r.requests, o.requests-o.good, o.requests)
}

// targets checks the targets for one SLO row against its own figures.
func targets(results []scenarioResult, row string) {
	fmt.Printf("\nTargets (%s):\n", row)
	n := len(results)
	var withinPt, overRR, cheaper int
	var cheapSavings []float64
	var worstRR string
	for _, s := range results {
		r, a, rr := s.rows[row], s.rows[rowAffinity], s.rows[rowRR]
		if r.goodput() >= a.goodput()-0.01 {
			withinPt++
		}
		if r.goodput() >= rr.goodput() {
			overRR++
		} else {
			worstRR += fmt.Sprintf(" #%d (%.2f%% < %.2f%%: %d of %d against %d of %d within the SLO; one-sided Fisher p %.2f)", s.sc.id,
				100*r.goodput(), 100*rr.goodput(), r.good, r.requests, rr.good, rr.requests, fisherBelow(r, rr))
		}
		if r.perMGood() <= a.perMGood() {
			cheaper++
		}
		if s.sc.cheapMeetsSLO() {
			cheapSavings = append(cheapSavings, 1-r.perMGood()/a.perMGood())
		}
	}
	share := func(k int) float64 { return float64(k) / float64(max(1, n)) }
	loadgen.Check("goodput ≥ affinity's − 1 pt in ≥ 95% of scenarios", share(withinPt) >= 0.95, "%d of %d", withinPt, n)
	loadgen.Check("goodput ≥ round-robin's in every scenario", overRR == n, "%d of %d%s", overRR, n, worstRR)
	loadgen.Check("$ per 1M good output tokens ≤ affinity's in ≥ 90% of scenarios", share(cheaper) >= 0.9, "%d of %d", cheaper, n)
	med := spread(cheapSavings, true).median
	loadgen.Check("$ per 1M good output tokens ≥ 20% below affinity's, median of the scenarios where a cheaper class can meet the SLO",
		len(cheapSavings) > 0 && med >= 0.20, "%.0f%% lower in the median of %d scenarios", 100*med, len(cheapSavings))
	if results[0].sc.lag > 0 {
		within, worst := 0, math.Inf(1)
		for _, s := range results {
			d := 100 * (s.rows[row].goodput() - s.rows[rowAffinity].goodput())
			worst = min(worst, d)
			if d >= -2 {
				within++
			}
		}
		loadgen.Check("a starved gateway: goodput within 2 pts of affinity's under the same lag, every scenario", within == n,
			"%d of %d; worst %+.1f pts", within, n, worst)
	}
}

// decisionCost checks SLO placement's decision p99 against affinity's: each run's p99 of the machine's time per
// Pick, the median over runs, both rows measured alike in the same process.
func decisionCost(results []scenarioResult) {
	var slo, aff []time.Duration
	for _, s := range results {
		slo = append(slo, s.rows[rowSLO].decisionP99...)
		aff = append(aff, s.rows[rowAffinity].decisionP99...)
	}
	a, b := loadgen.Quantile(slo, 0.5), loadgen.Quantile(aff, 0.5)
	fmt.Println("\nDecision cost:")
	loadgen.Check("SLO placement's decision p99 ≤ 1.5× affinity's (median over runs)", float64(a) <= 1.5*float64(b),
		"%.0f µs against %.0f µs (%.2f×)", float64(a)/1e3, float64(b)/1e3, float64(a)/float64(max(b, 1)))
}

// classFigures are one class's misses and prediction errors in a row (printed with -v -scenario).
type classFigures struct {
	served, ttftMiss, tpotMiss   int
	predictedLate, missedMeeting int       // predicted past 0.8 × the TTFT target; of the others, those that missed
	ratios                       []float64 // observed ÷ predicted TTFT
}

func (c *classFigures) add(o outcome, ttft, tpot time.Duration) {
	c.served++
	if o.ttft > ttft {
		c.ttftMiss++
	}
	if o.tpot > tpot {
		c.tpotMiss++
	}
	if o.predicted > 0 && float64(o.predicted) > 0.8*float64(ttft-o.sentAfter) {
		c.predictedLate++
	} else if o.predicted > 0 && o.ttft > ttft {
		c.missedMeeting++
	}
	if o.predicted > 0 {
		c.ratios = append(c.ratios, float64(o.ttft-o.sentAfter)/float64(o.predicted))
	}
}

func (c *classFigures) String() string {
	med := spread(c.ratios, true).median
	return fmt.Sprintf("%d served, TTFT missed %.0f%%, TPOT missed %.0f%%, observed÷predicted TTFT %.2f, predicted late %d, missed though predicted in time %d",
		c.served, 100*float64(c.ttftMiss)/float64(max(1, c.served)), 100*float64(c.tpotMiss)/float64(max(1, c.served)), med, c.predictedLate, c.missedMeeting)
}
