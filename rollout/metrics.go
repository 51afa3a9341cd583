package rollout

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the rollouts' series: every replica reports the shared state it read and the gates it judged
// from its own traffic.
type Metrics struct {
	Step        *prometheus.GaugeVec
	Share       *prometheus.GaugeVec
	Phase       *prometheus.GaugeVec
	Gate        *prometheus.GaugeVec
	Evidence    *prometheus.GaugeVec
	Requests    *prometheus.GaugeVec
	Transitions *prometheus.CounterVec
	// EvalPassRate is each arm's pass rate in the eval gate's last run on this replica.
	EvalPassRate *prometheus.GaugeVec
	// Forged counts shared states that did not open with the message key (SealedStore).
	Forged prometheus.Counter
}

// NewMetrics registers the series with reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Step: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_step",
			Help: "The rollout step in force, counting from 1 (0 while the compatibility gate has not passed or after a rollback or abort)."}, []string{"model"}),
		Share: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_candidate_share",
			Help: "The candidate's share of the model's conversation groups, 0 to 1."}, []string{"model"}),
		Phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_state",
			Help: "1 for the rollout's current phase: checking, evaluating, shadowing, progressing, paused, promoted, rolled_back or aborted."}, []string{"model", "phase"}),
		Gate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_gate_value",
			Help: "The candidate against the baseline over the step so far, as this replica sampled it: goodput_ratio, error_rate_increase, ttft_ratio and tpot_ratio (medians), ttft_p95_ratio, tpot_p95_ratio, output_ratio (medians of output tokens), unfinished_rate_increase (answers cut at max tokens, filtered or aborted)."}, []string{"model", "gate"}),
		Evidence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_gate_evidence",
			Help: "Each gate's evidence (errors, goodput, ttft, tpot, output, finish) that the candidate is worse than its margin, as a fraction of what rolls it back (1): the log mixture likelihood ratio over log(1/alpha); below 0 reads as -1."}, []string{"model", "gate"}),
		Requests: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_step_requests",
			Help: "Requests of each arm the gates have sampled in the step so far, as this replica saw them."}, []string{"model", "arm"}),
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_rollout_transitions_total",
			Help: "Rollout transitions this replica made, by the phase entered."}, []string{"model", "phase"}),
		EvalPassRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "infergate_rollout_eval_pass_rate",
			Help: "Each arm's pass rate, 0 to 1: set=golden over the eval gate's golden set in its last run on this replica (the replica that ran it); set=shadow the judge's mean score of this replica's shadow pairs so far."}, []string{"model", "set", "arm"}),
		Forged: prometheus.NewCounter(prometheus.CounterOpts{Name: "infergate_rollout_state_forged_total",
			Help: "Rollout states read from Redis that did not open with the message key (unsigned or forged): each is read as none and replaced."}),
	}
	if reg != nil {
		reg.MustRegister(m.Step, m.Share, m.Phase, m.Gate, m.Evidence, m.Requests, m.Transitions, m.EvalPassRate, m.Forged)
	}
	return m
}

var phases = []Phase{Checking, Evaluating, Shadowing, Progressing, Paused, Promoted, RolledBack, Aborted}

// state records a model's state as read.
func (m *Metrics) state(model string, s State, share float64) {
	step := 0
	if s.Phase == Progressing || s.Phase == Paused {
		step = s.Step + 1
	}
	m.Step.WithLabelValues(model).Set(float64(step))
	m.Share.WithLabelValues(model).Set(share)
	for _, p := range phases {
		v := 0.0
		if p == s.Phase {
			v = 1
		}
		m.Phase.WithLabelValues(model, string(p)).Set(v)
	}
}

// verdict records the figures a gate evaluation compared.
func (m *Metrics) verdict(model string, v Verdict) {
	f := v.Figures
	m.Gate.WithLabelValues(model, "goodput_ratio").Set(f.GoodputRatio)
	m.Gate.WithLabelValues(model, "error_rate_increase").Set(f.ErrorRateIncrease)
	m.Gate.WithLabelValues(model, "ttft_ratio").Set(f.TTFTRatio)
	m.Gate.WithLabelValues(model, "tpot_ratio").Set(f.TPOTRatio)
	m.Gate.WithLabelValues(model, "ttft_p95_ratio").Set(f.TTFTP95Ratio)
	m.Gate.WithLabelValues(model, "tpot_p95_ratio").Set(f.TPOTP95Ratio)
	m.Gate.WithLabelValues(model, "output_ratio").Set(f.OutputRatio)
	m.Gate.WithLabelValues(model, "unfinished_rate_increase").Set(f.UnfinishedRateIncrease)
	for gate, e := range f.Evidence {
		m.Evidence.WithLabelValues(model, gate).Set(e)
	}
	m.Requests.WithLabelValues(model, "candidate").Set(float64(f.CandidateRequests))
	m.Requests.WithLabelValues(model, "baseline").Set(float64(f.BaselineRequests))
}

// eval records an eval gate's run over a set (golden, shadow).
func (m *Metrics) eval(model, set string, r EvalReport) {
	m.EvalPassRate.WithLabelValues(model, set, "candidate").Set(r.Candidate)
	m.EvalPassRate.WithLabelValues(model, set, "baseline").Set(r.Baseline)
}

// forget drops the series of a model whose rollout left the policy.
func (m *Metrics) forget(model string) {
	for _, v := range []*prometheus.GaugeVec{m.Step, m.Share, m.Phase, m.Gate, m.Evidence, m.Requests, m.EvalPassRate} {
		v.DeletePartialMatch(prometheus.Labels{"model": model})
	}
}
