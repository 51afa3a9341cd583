package rollout

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
)

// Errors of Command, which the admin endpoint maps to statuses.
var (
	// ErrNoRollout: the policy has no rollout for the model.
	ErrNoRollout = errors.New("the policy has no rollout for this model")
	// ErrNotApplicable: the command does not apply to the rollout's phase.
	ErrNotApplicable = errors.New("the command does not apply to the rollout's phase")
	// ErrConflict: other replicas kept changing the state; try again.
	ErrConflict = errors.New("the rollout state kept changing; try again")
)

// storeTimeout bounds each round trip to the state store.
const storeTimeout = 2 * time.Second

// Options wire a Controller.
type Options struct {
	Policies *policies.Store
	// Store holds the states every replica shares (default: a MemoryStore, this replica only).
	Store Store
	// Engines, when set, must report fresh metrics for the candidate's endpoints before the first step.
	Engines EngineView
	// Client asks engines for their /v1/models (default: a 2 s timeout).
	Client *http.Client
	// EvalClient asks both arms the eval gate's golden set and calls its webhooks (default: no timeout of its
	// own; the policy's eval timeout bounds each call).
	EvalClient *http.Client
	Metrics    *Metrics
	Logger     *slog.Logger
	// Now is the clock of steps and windows (default time.Now).
	Now func() time.Time
}

// Controller runs every rollout of the policy: it samples both arms (it is a settle observer), tests the
// gates each tick, moves the shared state and publishes each model's candidate share to the director.
// Every replica runs one; the state store's swap makes their transitions agree.
type Controller struct {
	opts    Options
	samples *Samples
	check   checker
	shares  atomic.Pointer[map[string]float64]
	seeds   atomic.Pointer[map[string]uint64]  // each model's State.ArmSeed as last read
	shadows atomic.Pointer[map[string]float64] // each model's shadow share while shadowing
	onShare atomic.Pointer[func()]             // OnShareChange's listener

	mu      sync.Mutex // one Tick or Command at a time
	pending map[string]int
	status  map[string]Status
	gates   map[string]*GateStatus // the last evaluation of each model
	// baseline is each model's last step sample in which the baseline had enough requests: at a 100 % step
	// the baseline takes none, and the candidate is judged against it (stored in the state, thinned, on
	// entering the step).
	baseline map[string]Arm
	// since is the run (State.Since) each model's samples hold: a new run starts them empty.
	since map[string]time.Time
	// failed holds a failed gate's reason until the rollback is saved: the share is 0 meanwhile.
	failed map[string]string
	// id names this replica in the eval gate's lease (State.EvalBy); evals are its runs, evalReports each
	// model's last finished one.
	id          string
	evals       evalJobs
	evalReports map[string]EvalReport
	// pairs are the judged shadow pairs of each model's run.
	pairs pairTallies
}

// Status is one model's rollout as this replica last read it, for the CLI.
type Status struct {
	Model     string   `json:"model"`
	Candidate string   `json:"candidate"` // the pool, or "servedModel:<name>"
	Baseline  []string `json:"baseline"`
	State
	Steps int     `json:"steps"`
	Share float64 `json:"share"`
	// Shared says whether the state is shared with other replicas (Redis) or this replica's alone.
	Shared bool `json:"shared"`
	// Gates is this replica's last evaluation (while progressing or paused; kept after a rollback).
	Gates *GateStatus `json:"gates,omitempty"`
	// Eval is the eval gate's last run on this replica, if it ran one.
	Eval *EvalReport `json:"eval,omitempty"`
}

// GateStatus is a verdict as the CLI shows it.
type GateStatus struct {
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
	Figures
}

// New builds a Controller; Policies is required.
func New(o Options) *Controller {
	if o.Store == nil {
		o.Store = NewMemoryStore()
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 2 * time.Second}
	}
	if o.EvalClient == nil {
		o.EvalClient = &http.Client{}
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Controller{opts: o, check: checker{engines: o.Engines, client: o.Client},
		pending: map[string]int{}, status: map[string]Status{}, gates: map[string]*GateStatus{}, baseline: map[string]Arm{},
		since: map[string]time.Time{}, failed: map[string]string{}, samples: NewSamples(),
		id: fmt.Sprintf("%016x", newArmSeed()), evals: evalJobs{}, evalReports: map[string]EvalReport{}}
	c.shares.Store(&map[string]float64{})
	c.seeds.Store(&map[string]uint64{})
	c.shadows.Store(&map[string]float64{})
	return c
}

// Settled implements director.SettleObserver: both arms' requests are the gates' samples.
func (c *Controller) Settled(st director.Settlement) { c.samples.Settled(st) }

// Share implements director.Rollouts: the candidate's share of a model's traffic, 0 until the controller
// has read the model's state.
func (c *Controller) Share(model string) float64 { return (*c.shares.Load())[model] }

// ShadowShare implements director.Rollouts: the share of a model's baseline requests copied to the candidate,
// above 0 only in the shadow phase.
func (c *Controller) ShadowShare(model string) float64 { return (*c.shadows.Load())[model] }

// ArmSeed implements director.Rollouts: the secret seed of a model's arms, 0 until the controller has read the
// model's state (the share is 0 then too).
func (c *Controller) ArmSeed(model string) uint64 { return (*c.seeds.Load())[model] }

// Run ticks every interval until ctx ends.
func (c *Controller) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick runs one round for every rollout of the current policy: read the shared state, judge, move it on,
// publish the share.
func (c *Controller) Tick(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	snap := c.opts.Policies.Current()
	shares, seeds, shadows := map[string]float64{}, map[string]uint64{}, map[string]float64{}
	live := map[string]bool{}
	for i := range snap.Policy.Spec.Models {
		m := &snap.Policy.Spec.Models[i]
		plan, ok := snap.Rollout(m)
		if !ok {
			continue
		}
		live[m.Name] = true
		st, ok := c.round(ctx, plan)
		if !ok {
			// The store is unreachable: keep what was in force.
			shares[m.Name], seeds[m.Name] = c.Share(m.Name), c.ArmSeed(m.Name)
			continue
		}
		shares[m.Name], seeds[m.Name] = st.Share(plan), st.ArmSeed
		if st.Phase == Shadowing && plan.Shadow != nil {
			shadows[m.Name] = plan.Shadow.Share
		}
	}
	for model := range c.status {
		if !live[model] {
			delete(c.status, model)
			delete(c.pending, model)
			delete(c.gates, model)
			delete(c.baseline, model)
			delete(c.since, model)
			delete(c.failed, model)
			delete(c.evalReports, model)
			c.evals.drop(model)
			c.samples.reset(model)
			c.opts.Metrics.forget(model)
		}
	}
	c.seeds.Store(&seeds)
	c.shadows.Store(&shadows)
	c.publish(shares)
}

// OnShareChange sets what is called when a model's candidate share moved (the xDS weights follow it); it
// replaces an earlier listener. Wire it before Run: a share that moves before then is not told.
func (c *Controller) OnShareChange(f func()) { c.onShare.Store(&f) }

// publish swaps the shares in and tells the OnShareChange listener when one moved.
func (c *Controller) publish(shares map[string]float64) {
	if old := c.shares.Swap(&shares); !maps.Equal(*old, shares) {
		if f := c.onShare.Load(); f != nil {
			(*f)()
		}
	}
}

// round reads one model's state and moves it; ok is false when the store could not be read.
func (c *Controller) round(ctx context.Context, plan *policies.RolloutPlan) (State, bool) {
	model := plan.Model.Name
	raw, st, err := c.load(ctx, plan)
	if err != nil {
		c.opts.Logger.Warn("rollout state unreadable; the candidate's share stays as it was", "model", model, "err", err)
		return State{}, false
	}
	now := c.opts.Now()
	next, verdict := st, (*Verdict)(nil)
	switch st.Phase {
	case Checking:
		if err := c.check.check(ctx, plan); err != nil {
			next.Reason = "compatibility gate: " + err.Error()
		} else if plan.Eval != nil && len(plan.Eval.Cases) > 0 {
			next = State{Plan: st.Plan, Phase: Evaluating, StepStarted: now, ArmSeed: st.ArmSeed,
				Reason: "the compatibility gate passed: the eval gate runs next"}
		} else {
			next = enterTraffic(plan, st, now, "the compatibility gate passed")
		}
	case Evaluating:
		next = c.evaluating(plan, st, now)
	case Shadowing, Progressing, Paused:
		next, verdict = c.judge(plan, st, now)
	default:
		delete(c.failed, model)
	}
	if st.Phase != Evaluating {
		c.evals.drop(model) // an operator moved the rollout on
	}
	if next.ArmSeed == 0 {
		next.ArmSeed = newArmSeed() // a state saved before arms were keyed
	}
	if len(raw) == 0 || !sameState(next, st) {
		ok, err := c.swap(ctx, model, raw, next)
		if !ok || err != nil {
			if err != nil {
				c.opts.Logger.Warn("rollout state not saved; retried next tick", "model", model, "err", err)
			}
			if next.Phase == st.Phase && next.Step == st.Step {
				c.pending[model] += next.StepRequests - st.StepRequests // counted again next tick
			}
			if next.Phase == RolledBack && st.Phase == Progressing {
				// The rollback holds here at once; the next tick saves it for every replica.
				c.failed[model] = next.Reason
				c.remember(plan, next, verdict)
				return next, true
			}
			c.remember(plan, st, verdict)
			return st, true
		}
		delete(c.failed, model)
		if (st.Phase == Checking || st.Phase == Evaluating) && (next.Phase == Progressing || next.Phase == Shadowing) {
			c.newRun(model, next.Since)
		}
		c.followEval(plan, next)
		if next.Phase == Progressing || next.Phase == Shadowing {
			c.samples.judgeFrom(model, judgingStart(plan, next)) // the requests until the next tick count
		}
		c.transition(plan, st, next, verdict)
		st = next
	}
	c.remember(plan, st, verdict)
	return st, true
}

// enterTraffic is the state in which the candidate first takes traffic, or shadow copies, now.
func enterTraffic(plan *policies.RolloutPlan, st State, now time.Time, reason string) State {
	next := State{Plan: st.Plan, Phase: Progressing, StepStarted: now, Since: now, Reason: reason, ArmSeed: st.ArmSeed}
	if plan.Shadow != nil {
		next.Phase, next.Reason = Shadowing, reason+": shadowing"
	}
	return next
}

// judge tests a progressing or paused rollout's gates on this replica's samples of the current step and
// advances it. Both arms are sampled from the same instant: the step's start, or the end of the candidate's
// warm-up if later.
func (c *Controller) judge(plan *policies.RolloutPlan, st State, now time.Time) (State, *Verdict) {
	model := plan.Model.Name
	if !c.since[model].Equal(st.Since) {
		c.newRun(model, st.Since) // another replica started it
	}
	c.samples.judgeFrom(model, judgingStart(plan, st))
	cand, base := c.samples.Arms(model, plan.Gates.MinRequests)
	if base.Requests >= plan.Gates.MinRequests {
		c.baseline[model] = base
	} else if st.Share(plan) == 1 {
		if st.Baseline != nil {
			base = *st.Baseline
		} else if last, ok := c.baseline[model]; ok {
			base = last.reference()
		}
	}
	v := Evaluate(plan.Gates, plan.GateAlpha(), cand, base)
	c.opts.Metrics.verdict(model, v)
	if st.Phase == Shadowing {
		v = c.judgePairs(plan, v)
	}
	more := c.pending[model] + c.samples.TakeCount(model)
	c.pending[model] = 0
	if reason, ok := c.failed[model]; ok && st.Phase == Progressing {
		v = Verdict{Result: Fail, Reason: reason, Figures: v.Figures} // a failure not saved yet
	}
	next, _ := st.Advance(plan, v, more, now)
	if st.Phase == Paused {
		next.StepRequests += more
	}
	if next.Phase == Progressing && next.Step != st.Step && next.Share(plan) == 1 {
		if last, ok := c.baseline[model]; ok {
			ref := last.reference()
			next.Baseline = &ref
		}
	}
	return next, &v
}

// judgingStart is when a step's judged requests begin: the step's start, or the end of the candidate's
// warm-up if later.
func judgingStart(plan *policies.RolloutPlan, st State) time.Time {
	if warm := st.Since.Add(plan.Warmup); warm.After(st.StepStarted) {
		return warm
	}
	return st.StepStarted
}

// newRun starts a run of a model's rollout (the compatibility gate passed): its samples, pending count and
// baseline reference start empty, so nothing of a previous run is judged.
func (c *Controller) newRun(model string, since time.Time) {
	c.samples.reset(model)
	c.pairs.reset(model)
	c.since[model], c.pending[model] = since, 0
	delete(c.baseline, model)
}

// newArmSeed draws a rollout's arm seed; never 0, which reads as "none yet".
func newArmSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (it panics rather than return short)
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// sameState compares states by value (the baseline summary's too).
func sameState(a, b State) bool {
	ab, bb := a.Baseline, b.Baseline
	a.Baseline, b.Baseline = nil, nil
	return a == b && (ab == nil) == (bb == nil) && (ab == nil || ab.equal(*bb))
}

// load reads a model's state; a missing, unreadable or other plan's state is a new rollout, checking.
func (c *Controller) load(ctx context.Context, plan *policies.RolloutPlan) ([]byte, State, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	raw, err := c.opts.Store.Load(ctx, plan.Model.Name)
	if err != nil {
		return nil, State{}, err
	}
	fp := Fingerprint(plan)
	var st State
	if raw == nil || json.Unmarshal(raw, &st) != nil || st.Plan != fp || !st.valid(plan) {
		st = State{Plan: fp, Phase: Checking, StepStarted: c.opts.Now(), Reason: "a new rollout: checking the candidate's compatibility",
			ArmSeed: newArmSeed()}
		if raw == nil {
			raw = []byte{} // swap from "no state"
		}
	}
	return raw, st, nil
}

func (c *Controller) swap(ctx context.Context, model string, old []byte, next State) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	b, err := json.Marshal(next)
	if err != nil {
		return false, err
	}
	if len(old) == 0 {
		old = nil
	}
	return c.opts.Store.Swap(ctx, model, old, b)
}

// transition logs and counts a phase or step this replica moved.
func (c *Controller) transition(plan *policies.RolloutPlan, from, to State, v *Verdict) {
	if from.Phase == to.Phase && from.Step == to.Step && from.Reason == to.Reason {
		return
	}
	moved := from.Phase != to.Phase || from.Step != to.Step
	if moved {
		c.opts.Metrics.Transitions.WithLabelValues(plan.Model.Name, string(to.Phase)).Inc()
	}
	attrs := []any{"model", plan.Model.Name, "from", from.Phase, "to", to.Phase, "step", to.Step + 1,
		"steps", len(plan.Steps), "share", to.Share(plan), "reason", to.Reason}
	if v != nil {
		f := v.Figures
		attrs = append(attrs, "gate_result", v.Result.String(), "candidate_requests", f.CandidateRequests,
			"baseline_requests", f.BaselineRequests, "goodput_ratio", f.GoodputRatio,
			"error_rate_increase", f.ErrorRateIncrease, "ttft_ratio", f.TTFTRatio, "tpot_ratio", f.TPOTRatio,
			"ttft_p95_ratio", f.TTFTP95Ratio, "tpot_p95_ratio", f.TPOTP95Ratio, "evidence", f.Evidence)
	}
	switch {
	case to.Phase == RolledBack:
		c.opts.Logger.Warn("rollout rolled back", attrs...)
	case moved:
		c.opts.Logger.Info("rollout transition", attrs...)
	default:
		c.opts.Logger.Info("rollout held", attrs...)
	}
}

// remember keeps a model's status for the CLI and its series.
func (c *Controller) remember(plan *policies.RolloutPlan, st State, v *Verdict) {
	s := Status{Model: plan.Model.Name, State: st, Steps: len(plan.Steps), Share: st.Share(plan), Shared: c.opts.Store.Shared()}
	if plan.Candidate != nil {
		s.Candidate = plan.Candidate.Name
	} else {
		s.Candidate = "servedModel:" + plan.CandidateServed
	}
	for _, p := range plan.Baseline {
		s.Baseline = append(s.Baseline, p.Name)
	}
	if v != nil {
		c.gates[plan.Model.Name] = &GateStatus{Result: v.Result.String(), Reason: v.Reason, Figures: v.Figures}
	}
	s.Gates = c.gates[plan.Model.Name]
	if r, ok := c.evalReports[plan.Model.Name]; ok {
		s.Eval = &r
	}
	c.status[plan.Model.Name] = s
	c.opts.Metrics.state(plan.Model.Name, st, s.Share)
}

// Statuses returns every rollout as this replica last read it (at its last tick, or command).
func (c *Controller) Statuses() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Status, 0, len(c.status))
	for _, model := range sortedKeys(c.status) {
		out = append(out, c.status[model])
	}
	return out
}

// Command applies an operator's command to a model's rollout, in the shared state, and publishes the share
// at once.
func (c *Controller) Command(ctx context.Context, model string, cmd Command) (Status, error) {
	snap := c.opts.Policies.Current()
	m, ok := snap.Model(model)
	if !ok {
		return Status{}, ErrNoRollout
	}
	plan, ok := snap.Rollout(m)
	if !ok {
		return Status{}, ErrNoRollout
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for range 5 {
		raw, st, err := c.load(ctx, plan)
		if err != nil {
			return Status{}, err
		}
		next, ok := st.Apply(cmd, c.opts.Now())
		if !ok {
			return Status{}, ErrNotApplicable
		}
		swapped, err := c.swap(ctx, model, raw, next)
		if err != nil {
			return Status{}, err
		}
		if !swapped {
			continue
		}
		c.transition(plan, st, next, nil)
		c.remember(plan, next, nil)
		shares := maps.Clone(*c.shares.Load())
		shares[model] = next.Share(plan)
		c.publish(shares)
		return c.status[model], nil
	}
	return Status{}, ErrConflict
}
