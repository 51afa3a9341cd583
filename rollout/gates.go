package rollout

import (
	"fmt"
	"math"
	"slices"

	"github.com/infergate/infergate/policies"
)

// Result is what a gate evaluation concluded.
type Result int

// Results of Evaluate.
const (
	Insufficient Result = iota // too few requests on an arm: hold
	Pass
	Fail
)

func (r Result) String() string {
	return [...]string{"insufficient", "pass", "fail"}[r]
}

// Verdict is one evaluation: its result, the gate that failed (or why data is insufficient), and the figures
// compared, for the transition's log event and the gate metrics.
type Verdict struct {
	Result  Result
	Reason  string
	Figures Figures
}

// Figures are the candidate's measures against the baseline's over the step so far, and each gate's evidence.
type Figures struct {
	CandidateRequests, BaselineRequests int
	// GoodputRatio is the candidate's good share ÷ the baseline's; ErrorRateIncrease the candidate's error
	// rate less the baseline's; TTFTRatio and TPOTRatio the medians' ratios, TTFTP95Ratio and TPOTP95Ratio the
	// p95s' (0 without samples on either side).
	GoodputRatio, ErrorRateIncrease float64
	TTFTRatio, TPOTRatio            float64
	TTFTP95Ratio, TPOTP95Ratio      float64
	// OutputRatio is the medians' ratio of output tokens.
	OutputRatio float64
	// UnfinishedRateIncrease is the candidate's share of answers that did not end on their own (finish
	// reason length, content_filter, other) less the baseline's.
	UnfinishedRateIncrease float64
	// Evidence is each gate's log mixture likelihood ratio over its rejection threshold, log(1/α): a gate
	// fails at 1 (see stats.go), keyed goodput, errors, ttft, tpot.
	Evidence map[string]float64 `json:",omitempty"`
}

// Mixture scales τ of each gate's prior (stats.go): about the smallest departure beyond the margin a gate
// should find quickly. Latency gates estimate P(candidate > r·baseline) − ½; rate gates a difference of
// proportions.
const (
	tauLatency = 0.1
	tauErrors  = 0.03
	tauGoodput = 0.05
)

// Evaluate tests the candidate against the baseline, both sampled over the same span, with a plan's gates;
// alpha is one gate's share of the rollout's error budget for this step (RolloutPlan.GateAlpha).
func Evaluate(g policies.RolloutGates, alpha float64, candidate, baseline Arm) Verdict {
	f := Figures{CandidateRequests: candidate.Requests, BaselineRequests: baseline.Requests,
		ErrorRateIncrease: candidate.ErrorRate() - baseline.ErrorRate(),
		TTFTRatio:         quantileRatio(candidate.TTFT, baseline.TTFT, 0.5), TPOTRatio: quantileRatio(candidate.TPOT, baseline.TPOT, 0.5),
		TTFTP95Ratio: quantileRatio(candidate.TTFT, baseline.TTFT, 0.95), TPOTP95Ratio: quantileRatio(candidate.TPOT, baseline.TPOT, 0.95),
		OutputRatio: quantileRatio(candidate.Output, baseline.Output, 0.5), UnfinishedRateIncrease: candidate.UnfinishedRate() - baseline.UnfinishedRate()}
	if baseline.GoodRatio() > 0 {
		f.GoodputRatio = candidate.GoodRatio() / baseline.GoodRatio()
	}
	v := Verdict{Result: Pass, Figures: f}
	if candidate.Requests < g.MinRequests || baseline.Requests < g.MinRequests {
		v.Result, v.Reason = Insufficient, fmt.Sprintf("need %d requests on each arm, have %d and %d",
			g.MinRequests, candidate.Requests, baseline.Requests)
		return v
	}
	threshold := math.Log(1 / alpha)
	gates := []struct {
		name string
		est  Estimate
		tau  float64
		why  func() string
	}{
		{"errors", rateIncrease(candidate.Errors, candidate.Requests, baseline.Errors, baseline.Requests, g.MaxErrorRateIncrease), tauErrors,
			func() string {
				return fmt.Sprintf("error rate %.3f against the baseline's %.3f: more than +%.3f", candidate.ErrorRate(), baseline.ErrorRate(), g.MaxErrorRateIncrease)
			}},
		{"goodput", rateShortfall(candidate.Good, candidate.Requests, baseline.Good, baseline.Requests, g.MinGoodputRatio), tauGoodput,
			func() string {
				return fmt.Sprintf("goodput %.3f against the baseline's %.3f: below ×%.2f", candidate.GoodRatio(), baseline.GoodRatio(), g.MinGoodputRatio)
			}},
		{"ttft", ratioShift(candidate.TTFT, candidate.TTFTLoad, baseline.TTFT, baseline.TTFTLoad, g.MaxTTFTRatio, g.MinRequests), tauLatency,
			func() string {
				return fmt.Sprintf("TTFT ×%.2f the baseline's at the median (×%.2f at p95): more than ×%.2f", f.TTFTRatio, f.TTFTP95Ratio, g.MaxTTFTRatio)
			}},
		{"tpot", ratioShift(candidate.TPOT, candidate.TPOTLoad, baseline.TPOT, baseline.TPOTLoad, g.MaxTPOTRatio, g.MinRequests), tauLatency,
			func() string {
				return fmt.Sprintf("TPOT ×%.2f the baseline's at the median (×%.2f at p95): more than ×%.2f", f.TPOTRatio, f.TPOTP95Ratio, g.MaxTPOTRatio)
			}},
		{"finish", finishIncrease(candidate, baseline, g), tauErrors,
			func() string {
				return fmt.Sprintf("unfinished answers (cut at max tokens, filtered, aborted) %.3f against the baseline's %.3f: more than +%.3f",
					candidate.UnfinishedRate(), baseline.UnfinishedRate(), g.MaxUnfinishedIncrease)
			}},
		// Output length is two-sided: longer or shorter, each with half the gate's share.
		{"output", ratioShift(candidate.Output, nil, baseline.Output, nil, g.MaxOutputRatio, g.MinRequests), tauLatency,
			func() string {
				return fmt.Sprintf("output ×%.2f the baseline's length at the median: more than ×%.2f", f.OutputRatio, g.MaxOutputRatio)
			}},
		{"output", ratioShift(baseline.Output, nil, candidate.Output, nil, g.MaxOutputRatio, g.MinRequests), tauLatency,
			func() string {
				return fmt.Sprintf("output ×%.2f the baseline's length at the median: less than ×%.2f", f.OutputRatio, 1/g.MaxOutputRatio)
			}},
	}
	v.Figures.Evidence = map[string]float64{}
	for _, gate := range gates {
		th := threshold
		if gate.name == "output" {
			th = math.Log(2 / alpha) // each side of the two-sided gate
		}
		e := logMixtureLR(gate.est, gate.tau) / th
		if prev, ok := v.Figures.Evidence[gate.name]; !ok || e > prev {
			v.Figures.Evidence[gate.name] = max(e, -1) // a clearly healthy gate reads below 0; −∞ says nothing more
		}
		if e >= 1 && v.Result != Fail {
			v.Result, v.Reason = Fail, fmt.Sprintf("%s (at the gates' %g %% confidence, over the step's %d and %d requests)",
				gate.why(), 100*g.Confidence, candidate.Requests, baseline.Requests)
		}
	}
	return v
}

// finishIncrease estimates how far the candidate's share of unfinished answers exceeds the baseline's plus the
// margin; with fewer than minRequests answers of known finish reason on either arm (an engine or a body mode
// that does not show them) the gate has nothing to say, and does not hold the step.
func finishIncrease(candidate, baseline Arm, g policies.RolloutGates) Estimate {
	if candidate.Finished < max(g.MinRequests, 1) || baseline.Finished < max(g.MinRequests, 1) {
		return Estimate{}
	}
	return rateIncrease(candidate.Unfinished, candidate.Finished, baseline.Unfinished, baseline.Finished, g.MaxUnfinishedIncrease)
}

// ratioShift estimates whether the candidate's values (log latencies, log output tokens) exceed r times the
// baseline's at the same load (the values' load strata; nil for a measure the load does not move); with fewer
// than minSamples on either arm (a model that never streams has no TTFT) the gate has nothing to say.
func ratioShift(candidate []float64, candidateLoad []uint16, baseline []float64, baselineLoad []uint16, r float64, minSamples int) Estimate {
	if len(candidate) < max(minSamples, 2) || len(baseline) < max(minSamples, 2) {
		return Estimate{}
	}
	return stratifiedShift(candidate, candidateLoad, baseline, baselineLoad, math.Log(r))
}

// quantileRatio is the ratio of the two samples' q-quantiles (log seconds in, a plain ratio out), 0 when either
// is empty.
func quantileRatio(candidate, baseline []float64, q float64) float64 {
	if len(candidate) == 0 || len(baseline) == 0 {
		return 0
	}
	return math.Exp(quantile(candidate, q) - quantile(baseline, q))
}

func quantile(v []float64, q float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
