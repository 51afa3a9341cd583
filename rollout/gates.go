package rollout

import (
	"fmt"

	"github.com/infergate/infergate/policies"
)

// Result is what a gate evaluation concluded.
type Result int

// Results of Evaluate.
const (
	Insufficient Result = iota // too few requests in the window: hold
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

// Figures are the candidate's measures against the baseline's over one window.
type Figures struct {
	CandidateRequests, BaselineRequests int
	// GoodputRatio is the candidate's good share ÷ the baseline's; ErrorRateIncrease the candidate's error
	// rate less the baseline's; TTFTRatio and TPOTRatio the p95s' ratios (0 without samples on either side).
	GoodputRatio, ErrorRateIncrease, TTFTRatio, TPOTRatio float64
}

// Evaluate compares the candidate with the baseline over the same window against a plan's gates.
func Evaluate(g policies.RolloutGates, candidate, baseline Summary) Verdict {
	f := Figures{CandidateRequests: candidate.Requests, BaselineRequests: baseline.Requests,
		ErrorRateIncrease: candidate.ErrorRate() - baseline.ErrorRate()}
	if baseline.GoodRatio() > 0 {
		f.GoodputRatio = candidate.GoodRatio() / baseline.GoodRatio()
	}
	if candidate.TTFTP95 > 0 && baseline.TTFTP95 > 0 {
		f.TTFTRatio = float64(candidate.TTFTP95) / float64(baseline.TTFTP95)
	}
	if candidate.TPOTP95 > 0 && baseline.TPOTP95 > 0 {
		f.TPOTRatio = float64(candidate.TPOTP95) / float64(baseline.TPOTP95)
	}
	v := Verdict{Result: Pass, Figures: f}
	switch {
	case candidate.Requests < g.MinRequests || baseline.Requests < g.MinRequests:
		// Too few for a p95 to mean anything: the step holds.
		v.Result, v.Reason = Insufficient, fmt.Sprintf("need %d requests on each arm in the window, have %d and %d",
			g.MinRequests, candidate.Requests, baseline.Requests)
	case f.ErrorRateIncrease > g.MaxErrorRateIncrease:
		v.Result, v.Reason = Fail, fmt.Sprintf("error rate %.3f against the baseline's %.3f (at most +%.3f)",
			candidate.ErrorRate(), baseline.ErrorRate(), g.MaxErrorRateIncrease)
	case baseline.GoodRatio() > 0 && f.GoodputRatio < g.MinGoodputRatio:
		v.Result, v.Reason = Fail, fmt.Sprintf("goodput %.3f against the baseline's %.3f (at least ×%.2f)",
			candidate.GoodRatio(), baseline.GoodRatio(), g.MinGoodputRatio)
	case f.TTFTRatio > g.MaxTTFTP95Ratio:
		v.Result, v.Reason = Fail, fmt.Sprintf("TTFT p95 %v against the baseline's %v (at most ×%.2f)",
			candidate.TTFTP95, baseline.TTFTP95, g.MaxTTFTP95Ratio)
	case f.TPOTRatio > g.MaxTPOTP95Ratio:
		v.Result, v.Reason = Fail, fmt.Sprintf("TPOT p95 %v against the baseline's %v (at most ×%.2f)",
			candidate.TPOTP95, baseline.TPOTP95, g.MaxTPOTP95Ratio)
	}
	return v
}
