package policies

import (
	"slices"
	"time"
)

// Rollout releases a model's candidate — another pool (a new engine version or quantisation) or another
// served model name on the baseline's pools — in steps of traffic, each held until the gates comparing the
// candidate with the baseline over the same window pass, and rolled back at once when one fails.
type Rollout struct {
	// Candidate is what is released: exactly one of pool and servedModel.
	Candidate RolloutArm `yaml:"candidate" json:"candidate"`
	// Baseline are the pools serving the model as it is (default: every pool of the model but the candidate's).
	Baseline RolloutBaseline `yaml:"baseline,omitempty" json:"baseline,omitempty"`
	// Steps are the candidate's shares of traffic, in increasing order, the last 100.
	Steps []RolloutStep `yaml:"steps" json:"steps" jsonschema:"minItems=1"`
	// Gates are the tests comparing the arms over each step (docs/rollouts.md).
	Gates RolloutGates `yaml:"gates,omitempty" json:"gates,omitempty"`
	// Compatibility is checked before the first step: the candidate's engines must be healthy and report
	// these (empty: not checked).
	Compatibility RolloutCompatibility `yaml:"compatibility,omitempty" json:"compatibility,omitempty"`
	// Testers are tenants that may choose the arm of their own requests with the x-infergate-rollout header
	// (candidate or baseline); everyone else's header is ignored.
	Testers []string `yaml:"testers,omitempty" json:"testers,omitempty"`
	// Shadow, when set, is a phase before the first step in which no client request reaches the candidate: a
	// sample of the baseline's requests is also sent to it, its answers measured and thrown away (never
	// returned, never charged), and the gates judge them against the baseline's.
	Shadow *RolloutShadow `yaml:"shadow,omitempty" json:"shadow,omitempty"`
	// Eval, when set, is a golden set both arms answer after the compatibility gate and before any traffic
	// (or copy) reaches the candidate: the rollout goes on only if the candidate does about as well.
	Eval *RolloutEval `yaml:"eval,omitempty" json:"eval,omitempty"`
}

// RolloutShadow bounds the copies a shadow phase sends, so that it never costs the baseline's clients anything:
// a copy that would exceed a bound is not sent.
type RolloutShadow struct {
	// Percent is the share of the baseline's requests copied to the candidate (default 10).
	Percent float64 `yaml:"percent,omitempty" json:"percent,omitempty" jsonschema:"exclusiveMinimum=0,maximum=100"`
	// MaxConcurrent is how many copies may be in flight at once (default 8).
	MaxConcurrent int `yaml:"maxConcurrent,omitempty" json:"maxConcurrent,omitempty" jsonschema:"minimum=0"`
	// MaxPerSecond is how many copies may start per second (default 10).
	MaxPerSecond float64 `yaml:"maxPerSecond,omitempty" json:"maxPerSecond,omitempty" jsonschema:"minimum=0"`
	// MinDuration and MinRequests are how long the phase runs and how many copies it needs answered before the
	// first step (defaults 5m and 100).
	MinDuration string `yaml:"minDuration,omitempty" json:"minDuration,omitempty"`
	MinRequests int    `yaml:"minRequests,omitempty" json:"minRequests,omitempty" jsonschema:"minimum=0"`
}

// ShadowPlan is a rollout's shadow phase with defaults applied.
type ShadowPlan struct {
	Share         float64 // 0..1
	MaxConcurrent int
	MaxPerSecond  float64
	MinDuration   time.Duration
	MinRequests   int
}

// RolloutArm names a rollout's candidate: a pool of the model, or a served model name its baseline pools
// also serve (vLLM --served-model-name with a second name, a LoRA-free revision behind the same engines).
type RolloutArm struct {
	// Pool is a pool of the model that serves the candidate.
	Pool string `yaml:"pool,omitempty" json:"pool,omitempty"`
	// ServedModel is another name the baseline's engines serve, the candidate (vLLM --served-model-name).
	ServedModel string `yaml:"servedModel,omitempty" json:"servedModel,omitempty"`
}

// RolloutBaseline lists the baseline's pools.
type RolloutBaseline struct {
	// Pools are the baseline's pools, by name.
	Pools []string `yaml:"pools,omitempty" json:"pools,omitempty"`
}

// RolloutStep is one share of traffic and how long and how much of it must pass the gates before the next.
type RolloutStep struct {
	// Percent is the candidate's share of conversation groups, above 0 and at most 100.
	Percent float64 `yaml:"percent" json:"percent" jsonschema:"exclusiveMinimum=0,maximum=100"`
	// MinDuration is how long the step runs before it may advance, e.g. "5m" (default 5m).
	MinDuration string `yaml:"minDuration,omitempty" json:"minDuration,omitempty"`
	// MinRequests is how many candidate requests the step needs before it may advance (default 100).
	MinRequests int `yaml:"minRequests,omitempty" json:"minRequests,omitempty" jsonschema:"minimum=0"`
}

// RolloutGates test the candidate against the baseline over the same span of each step. Every gate is a
// one-sided sequential test with a margin (docs/rollouts.md): it fails only when the requests show, at the
// gates' confidence, that the candidate is worse than the margin allows. A zero field takes its default.
type RolloutGates struct {
	// MinGoodputRatio: the candidate's share of good requests (met their SLO) at least this times the
	// baseline's (default 0.95).
	MinGoodputRatio float64 `yaml:"minGoodputRatio,omitempty" json:"minGoodputRatio,omitempty" jsonschema:"minimum=0,maximum=1"`
	// MaxErrorRateIncrease: the candidate's error rate (upstream 5xx, resets, timeouts) at most the baseline's
	// plus this, as a fraction (default 0.01).
	MaxErrorRateIncrease float64 `yaml:"maxErrorRateIncrease,omitempty" json:"maxErrorRateIncrease,omitempty" jsonschema:"minimum=0,maximum=1"`
	// MaxUnfinishedIncrease: the candidate's share of answers that did not end on their own — cut at max
	// tokens, filtered, aborted: a finish reason other than stop and tool_calls — at most the baseline's plus
	// this, as a fraction (default 0.02). A model that stops rambling into max_tokens less or more often is
	// a different model.
	MaxUnfinishedIncrease float64 `yaml:"maxUnfinishedIncrease,omitempty" json:"maxUnfinishedIncrease,omitempty" jsonschema:"minimum=0,maximum=1"`
	// MaxTTFTRatio and MaxTPOTRatio: the candidate's latencies at most this times the baseline's, in the
	// Mann-Whitney sense — a candidate request is no likelier than not to be slower than r times a baseline
	// one (default 1.2: "worse by more than 20 %").
	MaxTTFTRatio float64 `yaml:"maxTTFTRatio,omitempty" json:"maxTTFTRatio,omitempty" jsonschema:"minimum=1"`
	MaxTPOTRatio float64 `yaml:"maxTPOTRatio,omitempty" json:"maxTPOTRatio,omitempty" jsonschema:"minimum=1"`
	// MaxOutputRatio: the candidate's output lengths (tokens) at most this times the baseline's and at least
	// its inverse, in the same Mann-Whitney sense — a model that starts answering in a quarter of the words, or
	// rambling, is rolled back (default 2).
	MaxOutputRatio float64 `yaml:"maxOutputRatio,omitempty" json:"maxOutputRatio,omitempty" jsonschema:"minimum=1"`
	// MaxTTFTP95Ratio and MaxTPOTP95Ratio are the earlier names of MaxTTFTRatio and MaxTPOTRatio, read as
	// them.
	MaxTTFTP95Ratio float64 `yaml:"maxTTFTP95Ratio,omitempty" json:"maxTTFTP95Ratio,omitempty" jsonschema:"minimum=1"`
	MaxTPOTP95Ratio float64 `yaml:"maxTPOTP95Ratio,omitempty" json:"maxTPOTP95Ratio,omitempty" jsonschema:"minimum=1"`
	// Confidence is the chance that a candidate within every margin goes through the whole rollout without a
	// rollback by one replica's gates, however often they look (default 0.99, between 0.5 and 0.9999).
	Confidence float64 `yaml:"confidence,omitempty" json:"confidence,omitempty" jsonschema:"minimum=0.5,maximum=0.9999"`
	// Window is no longer read: the gates test every request since the step began (after the warm-up). It is
	// still accepted, so that older policies load.
	Window string `yaml:"window,omitempty" json:"window,omitempty"`
	// MinRequests is how many requests each arm needs in the step before the gates judge it; with fewer the
	// step holds (default 50).
	MinRequests int `yaml:"minRequests,omitempty" json:"minRequests,omitempty" jsonschema:"minimum=0"`
	// Warmup is how long after the candidate first takes traffic its requests (and the baseline's) are left out
	// of the tests: a new engine starts with a cold KV cache, and its first TTFTs say nothing of its speed
	// (default "30s"; "0s" judges from the first request).
	Warmup string `yaml:"warmup,omitempty" json:"warmup,omitempty"`
}

// RolloutCompatibility is what the candidate's engines must report before any traffic reaches them.
type RolloutCompatibility struct {
	// Model is the model name the engines must serve (their /v1/models), default the candidate's served name.
	Model string `yaml:"model,omitempty" json:"model,omitempty"`
	// EngineVersion, when set, must equal the version the engine reports in its metrics (vLLM's
	// vllm:build_info or cache_config_info labels; dialects that report none fail the gate).
	EngineVersion string `yaml:"engineVersion,omitempty" json:"engineVersion,omitempty"`
}

// Rollout defaults.
const (
	DefaultRolloutStepDuration   = 5 * time.Minute
	DefaultRolloutStepRequests   = 100
	DefaultMinGoodputRatio       = 0.95
	DefaultMaxErrorRateIncrease  = 0.01
	DefaultMaxUnfinishedIncrease = 0.02
	DefaultMaxLatencyRatio       = 1.2
	DefaultMaxOutputRatio        = 2
	DefaultRolloutConfidence     = 0.99
	DefaultRolloutGateRequests   = 50
	DefaultRolloutWarmup         = 30 * time.Second
)

// RolloutPlan is a model's rollout resolved against its pools, with defaults applied.
type RolloutPlan struct {
	Model *Model
	// Candidate is the candidate's pool; nil when the candidate is a served model name on the baseline pools.
	Candidate *Pool
	// CandidateServed is the name the candidate is served as (the pool's servedModel, or the arm's).
	CandidateServed string
	Baseline        []*Pool
	Steps           []PlanStep
	Warmup          time.Duration
	Gates           RolloutGates // defaults applied (MinRequests too)
	Compatibility   RolloutCompatibility
	// Shadow is the shadow phase before the first step; nil without one.
	Shadow *ShadowPlan
	// Eval is the eval gate; nil without one.
	Eval    *EvalPlan
	testers []string
}

// PlanStep is a resolved rollout step.
type PlanStep struct {
	Share       float64 // 0..1
	MinDuration time.Duration
	MinRequests int
}

// RolloutGateCount is how many gates share a phase's error budget: errors, goodput, TTFT, TPOT, output length,
// finish reasons.
const RolloutGateCount = 6

// GateAlpha is one gate's share of the rollout's error budget in one step: 1 − Confidence split evenly over
// the gates and every step (a union bound, so the budget holds however the tests correlate).
func (p *RolloutPlan) GateAlpha() float64 {
	phases := len(p.Steps)
	if p.Shadow != nil {
		phases++ // the shadow phase is judged too
	}
	return (1 - p.Gates.Confidence) / float64(RolloutGateCount*max(1, phases))
}

// Tester says whether a tenant may choose the arm of its own requests.
func (p *RolloutPlan) Tester(t *Tenant) bool { return t != nil && slices.Contains(p.testers, t.Name) }

// Rollout returns the model's rollout plan, if the policy has one.
func (s *Snapshot) Rollout(m *Model) (*RolloutPlan, bool) {
	r, ok := s.rollouts[m]
	return r, ok
}

// HasRollouts says whether any model of the policy has a rollout.
func (s *Snapshot) HasRollouts() bool { return len(s.rollouts) > 0 }

// compileRollouts resolves every validated rollout.
func (s *Snapshot) compileRollouts(pol *Policy) {
	s.rollouts = map[*Model]*RolloutPlan{}
	for i := range pol.Spec.Models {
		m := &pol.Spec.Models[i]
		if m.Rollout == nil {
			continue
		}
		r := m.Rollout
		plan := &RolloutPlan{Model: m,
			Compatibility: r.Compatibility, testers: r.Testers, Gates: r.Gates, CandidateServed: r.Candidate.ServedModel}
		for j := range m.Pools {
			pool := &m.Pools[j]
			switch {
			case pool.Name == r.Candidate.Pool:
				plan.Candidate, plan.CandidateServed = pool, pool.ServedModel
			case !pool.ServesWhole():
				// A prefill-only pool takes no whole request: it is in neither arm.
			case len(r.Baseline.Pools) == 0 || slices.Contains(r.Baseline.Pools, pool.Name):
				plan.Baseline = append(plan.Baseline, pool)
			}
		}
		if plan.Compatibility.Model == "" {
			plan.Compatibility.Model = plan.CandidateServed
		}
		g := &plan.Gates
		g.MinGoodputRatio = orDefault(g.MinGoodputRatio, DefaultMinGoodputRatio)
		g.MaxErrorRateIncrease = orDefault(g.MaxErrorRateIncrease, DefaultMaxErrorRateIncrease)
		g.MaxUnfinishedIncrease = orDefault(g.MaxUnfinishedIncrease, DefaultMaxUnfinishedIncrease)
		g.MaxTTFTRatio = orDefault(orDefault(g.MaxTTFTRatio, g.MaxTTFTP95Ratio), DefaultMaxLatencyRatio)
		g.MaxTPOTRatio = orDefault(orDefault(g.MaxTPOTRatio, g.MaxTPOTP95Ratio), DefaultMaxLatencyRatio)
		g.MaxTTFTP95Ratio, g.MaxTPOTP95Ratio = 0, 0
		g.Confidence = orDefault(g.Confidence, DefaultRolloutConfidence)
		g.MaxOutputRatio = orDefault(g.MaxOutputRatio, DefaultMaxOutputRatio)
		if g.MinRequests == 0 {
			g.MinRequests = DefaultRolloutGateRequests
		}
		plan.Warmup = DefaultRolloutWarmup
		if d, err := time.ParseDuration(r.Gates.Warmup); err == nil && d >= 0 {
			plan.Warmup = d
		}
		if sh := r.Shadow; sh != nil {
			plan.Shadow = &ShadowPlan{Share: orDefault(sh.Percent, 10) / 100, MaxConcurrent: sh.MaxConcurrent,
				MaxPerSecond: orDefault(sh.MaxPerSecond, 10), MinDuration: durationOr(sh.MinDuration, DefaultRolloutStepDuration),
				MinRequests: sh.MinRequests}
			if plan.Shadow.MaxConcurrent == 0 {
				plan.Shadow.MaxConcurrent = 8
			}
			if plan.Shadow.MinRequests == 0 {
				plan.Shadow.MinRequests = DefaultRolloutStepRequests
			}
		}
		plan.Eval = compileEval(r.Eval)
		for _, st := range r.Steps {
			n := st.MinRequests
			if n == 0 {
				n = DefaultRolloutStepRequests
			}
			plan.Steps = append(plan.Steps, PlanStep{Share: st.Percent / 100, MinDuration: durationOr(st.MinDuration, DefaultRolloutStepDuration), MinRequests: n})
		}
		s.rollouts[m] = plan
	}
}

func durationOr(s string, d time.Duration) time.Duration {
	if v, err := time.ParseDuration(s); err == nil && v > 0 {
		return v
	}
	return d
}

func orDefault(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

// rollout validates a model's rollout against its pools and the tenants.
func (v *validator) rollout(s *Spec, m *Model, base []seg) {
	r := m.Rollout
	if r == nil {
		return
	}
	rb := append(slices.Clone(base), "rollout")
	pools := map[string]*Pool{}
	for j := range m.Pools {
		pools[m.Pools[j].Name] = &m.Pools[j]
	}
	c := r.Candidate
	switch {
	case (c.Pool == "") == (c.ServedModel == ""):
		v.fail(append(slices.Clone(rb), "candidate"), "name exactly one of pool and servedModel")
	case c.Pool != "" && pools[c.Pool] == nil:
		v.fail(append(slices.Clone(rb), "candidate", "pool"), "unknown pool %q of model %q", c.Pool, m.Name)
	case c.Pool != "" && slices.Contains(r.Baseline.Pools, c.Pool):
		v.fail(append(slices.Clone(rb), "candidate", "pool"), "pool %q is also in the baseline", c.Pool)
	case c.Pool != "" && !pools[c.Pool].ServesWhole():
		v.fail(append(slices.Clone(rb), "candidate", "pool"), "pool %q only prefills: a rollout's arms take whole requests", c.Pool)
	}
	for k, name := range r.Baseline.Pools {
		switch {
		case pools[name] == nil:
			v.fail(append(slices.Clone(rb), "baseline", "pools", k), "unknown pool %q of model %q", name, m.Name)
		case !pools[name].ServesWhole():
			v.fail(append(slices.Clone(rb), "baseline", "pools", k), "pool %q only prefills: a rollout's arms take whole requests", name)
		}
	}
	if c.Pool != "" && len(r.Baseline.Pools) == 0 && len(m.Pools) < 2 {
		v.fail(append(slices.Clone(rb), "candidate", "pool"), "the model has no other pool to be the baseline")
	}
	v.rolloutSteps(r.Steps, rb)
	if sh := r.Shadow; sh != nil {
		sb := append(slices.Clone(rb), "shadow")
		if sh.Percent < 0 || sh.Percent > 100 {
			v.fail(append(slices.Clone(sb), "percent"), "must be above 0 and at most 100, got %v", sh.Percent)
		}
		if sh.MaxConcurrent < 0 || sh.MaxPerSecond < 0 || sh.MinRequests < 0 {
			v.fail(sb, "maxConcurrent, maxPerSecond and minRequests must not be negative")
		}
		v.positiveDuration(append(slices.Clone(sb), "minDuration"), sh.MinDuration)
	}
	v.rolloutGates(&r.Gates, append(slices.Clone(rb), "gates"))
	v.eval(r.Eval, r.Shadow != nil, rb)
	tenants := map[string]bool{}
	for _, t := range s.Tenants {
		tenants[t.Name] = true
	}
	for k, name := range r.Testers {
		if !tenants[name] {
			v.fail(append(slices.Clone(rb), "testers", k), "unknown tenant %q", name)
		}
	}
}

// rolloutSteps checks a rollout's steps: rising percentages that end at 100.
func (v *validator) rolloutSteps(steps []RolloutStep, rb []seg) {
	if len(steps) == 0 {
		v.fail(append(slices.Clone(rb), "steps"), "at least one step is required, the last at 100 percent")
	}
	prev := 0.0
	for k, st := range steps {
		sb := append(slices.Clone(rb), "steps", k)
		switch {
		case st.Percent <= 0 || st.Percent > 100:
			v.fail(append(slices.Clone(sb), "percent"), "must be above 0 and at most 100, got %v", st.Percent)
		case st.Percent <= prev:
			v.fail(append(slices.Clone(sb), "percent"), "must be above the previous step's %v, got %v", prev, st.Percent)
		}
		prev = max(prev, st.Percent)
		v.positiveDuration(append(slices.Clone(sb), "minDuration"), st.MinDuration)
		if st.MinRequests < 0 {
			v.fail(append(slices.Clone(sb), "minRequests"), "must not be negative, got %d", st.MinRequests)
		}
	}
	if n := len(steps); n > 0 && steps[n-1].Percent != 100 {
		v.fail(append(slices.Clone(rb), "steps", n-1, "percent"), "the last step must be 100, got %v", steps[n-1].Percent)
	}
}

// rolloutGates checks a rollout's gates.
func (v *validator) rolloutGates(g *RolloutGates, gb []seg) {
	if g.MinGoodputRatio < 0 || g.MinGoodputRatio > 1 {
		v.fail(append(slices.Clone(gb), "minGoodputRatio"), "must be between 0 and 1, got %v", g.MinGoodputRatio)
	}
	if g.MaxErrorRateIncrease < 0 || g.MaxErrorRateIncrease > 1 {
		v.fail(append(slices.Clone(gb), "maxErrorRateIncrease"), "must be between 0 and 1, got %v", g.MaxErrorRateIncrease)
	}
	if g.MaxUnfinishedIncrease < 0 || g.MaxUnfinishedIncrease > 1 {
		v.fail(append(slices.Clone(gb), "maxUnfinishedIncrease"), "must be between 0 and 1, got %v", g.MaxUnfinishedIncrease)
	}
	for _, r := range []struct {
		name, old  string
		value, was float64
	}{{"maxTTFTRatio", "maxTTFTP95Ratio", g.MaxTTFTRatio, g.MaxTTFTP95Ratio}, {"maxTPOTRatio", "maxTPOTP95Ratio", g.MaxTPOTRatio, g.MaxTPOTP95Ratio}} {
		switch {
		case r.value != 0 && r.was != 0:
			v.fail(append(slices.Clone(gb), r.old), "is the earlier name of %s: set one of them", r.name)
		case r.value != 0 && r.value < 1:
			v.fail(append(slices.Clone(gb), r.name), "must be at least 1, got %v", r.value)
		case r.was != 0 && r.was < 1:
			v.fail(append(slices.Clone(gb), r.old), "must be at least 1, got %v", r.was)
		}
	}
	if g.MaxOutputRatio != 0 && g.MaxOutputRatio < 1 {
		v.fail(append(slices.Clone(gb), "maxOutputRatio"), "must be at least 1, got %v", g.MaxOutputRatio)
	}
	if g.Confidence != 0 && (g.Confidence < 0.5 || g.Confidence > 0.9999) {
		v.fail(append(slices.Clone(gb), "confidence"), "must be between 0.5 and 0.9999, got %v", g.Confidence)
	}
	v.positiveDuration(append(slices.Clone(gb), "window"), g.Window)
	if g.MinRequests < 0 {
		v.fail(append(slices.Clone(gb), "minRequests"), "must not be negative, got %d", g.MinRequests)
	}
	if d, err := time.ParseDuration(g.Warmup); g.Warmup != "" && (err != nil || d < 0) {
		v.fail(append(slices.Clone(gb), "warmup"), "must be a duration such as \"30s\" (\"0s\" for none), got %q", g.Warmup)
	}
}

func (v *validator) positiveDuration(path []seg, s string) {
	if s == "" {
		return
	}
	if d, err := time.ParseDuration(s); err != nil || d <= 0 {
		v.fail(path, "must be a positive duration such as \"5m\", got %q", s)
	}
}
