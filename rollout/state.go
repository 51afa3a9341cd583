package rollout

import (
	"fmt"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/policies"
)

// Phase is where a rollout stands.
type Phase string

// Phases of a rollout, after Flagger's and Argo Rollouts' state machines.
const (
	// Checking: the compatibility gate has not passed yet; no traffic reaches the candidate.
	Checking Phase = "checking"
	// Evaluating: the compatibility gate passed; one replica runs the eval gate's golden set against both arms
	// (the plan's eval gate). No traffic reaches the candidate.
	Evaluating Phase = "evaluating"
	// Shadowing: no client request reaches the candidate; copies of a sample of the baseline's do, and the
	// gates judge the candidate's answers (the plan's shadow phase).
	Shadowing Phase = "shadowing"
	// Progressing: the candidate takes its step's share while the gates pass.
	Progressing Phase = "progressing"
	// Paused: an operator holds the step; the share stays, nothing advances or rolls back by itself.
	Paused Phase = "paused"
	// Promoted: the candidate takes all traffic.
	Promoted Phase = "promoted"
	// RolledBack: a gate failed; the candidate takes nothing until an operator resumes.
	RolledBack Phase = "rolled_back"
	// Aborted: an operator stopped the rollout; the candidate takes nothing.
	Aborted Phase = "aborted"
)

// State is one model's rollout, as every gateway replica shares it.
type State struct {
	// Plan fingerprints the rollout this state belongs to (Fingerprint): a policy that names another candidate
	// or other steps starts a new rollout.
	Plan  string `json:"plan"`
	Phase Phase  `json:"phase"`
	// Step indexes the plan's steps (the step in force while progressing or paused, the one that failed once
	// rolled back).
	Step int `json:"step"`
	// StepStarted is when the step began; StepRequests the candidate requests it has seen.
	StepStarted  time.Time `json:"stepStarted"`
	StepRequests int       `json:"stepRequests"`
	// Since is when the candidate first took traffic in this run of the rollout: the gates' warm-up counts
	// from it.
	Since time.Time `json:"since,omitzero"`
	// Baseline is the baseline's sample of the step before a 100 % step, which gives the baseline no traffic,
	// thinned (Arm.reference): the candidate is judged against it, on every replica and across restarts.
	Baseline *Arm `json:"baseline,omitempty"`
	// Reason says why the last transition happened (a gate's figures, an operator's command).
	Reason string `json:"reason,omitempty"`
	// ArmSeed keys the hash that puts a conversation in an arm (picker.Split.Seed): drawn at random when the
	// rollout begins, the same on every replica, never shown to clients.
	ArmSeed uint64 `json:"armSeed,omitempty"`
	// EvalBy is the replica running the eval gate, until EvalUntil (its lease: past it, another replica may run
	// the gate). With EvalBy empty, EvalUntil is when an inconclusive run is tried again.
	EvalBy    string    `json:"evalBy,omitempty"`
	EvalUntil time.Time `json:"evalUntil,omitzero"`
}

// valid says whether a stored state can be in force for a plan (a corrupt document, or one of another number of
// steps, is not).
func (s State) valid(plan *policies.RolloutPlan) bool {
	switch s.Phase {
	case Checking, Evaluating, Shadowing, Progressing, Paused, Promoted, RolledBack, Aborted:
	default:
		return false
	}
	return s.Step >= 0 && s.Step < len(plan.Steps) && s.StepRequests >= 0
}

// Share is the candidate's share of traffic in this state.
func (s State) Share(plan *policies.RolloutPlan) float64 {
	switch s.Phase {
	case Progressing, Paused:
		if s.Step < len(plan.Steps) {
			return plan.Steps[s.Step].Share
		}
	case Promoted:
		return 1
	}
	return 0
}

// Advance moves a progressing rollout on a verdict at now, having seen more candidate requests since the
// last call: a failed gate rolls back at once; a pass after the step's duration and requests moves to the next
// step (or promotes after the last); too little data holds. changed says whether the phase or step moved.
func (s State) Advance(plan *policies.RolloutPlan, v Verdict, more int, now time.Time) (next State, changed bool) {
	if s.Phase == Shadowing {
		return s.advanceShadow(plan, v, more, now)
	}
	if s.Phase != Progressing {
		return s, false
	}
	s.StepRequests += more
	switch v.Result {
	case Fail:
		s.Phase, s.Reason = RolledBack, v.Reason
		return s, true
	case Insufficient:
		return s, false
	}
	step := plan.Steps[s.Step]
	if now.Sub(s.StepStarted) < step.MinDuration || s.StepRequests < step.MinRequests {
		return s, false
	}
	if s.Step == len(plan.Steps)-1 {
		s.Phase, s.Reason = Promoted, "every step passed its gates"
		return s, true
	}
	s.Step, s.StepStarted, s.StepRequests, s.Reason = s.Step+1, now, 0, "the step passed its gates"
	return s, true
}

// advanceShadow moves a shadow phase on a verdict over the candidate's copies: a failed gate rolls back before
// any client request reached the candidate; a pass after the phase's duration and copies starts the first step.
func (s State) advanceShadow(plan *policies.RolloutPlan, v Verdict, more int, now time.Time) (State, bool) {
	s.StepRequests += more
	switch v.Result {
	case Fail:
		s.Phase, s.Reason = RolledBack, "shadow: "+v.Reason
		return s, true
	case Insufficient:
		return s, false
	}
	sh := plan.Shadow
	if sh == nil || now.Sub(s.StepStarted) < sh.MinDuration || s.StepRequests < sh.MinRequests {
		return s, false
	}
	s.Phase, s.Step, s.StepStarted, s.StepRequests, s.Reason = Progressing, 0, now, 0, "the shadow phase passed its gates"
	return s, true
}

// Command is an operator's instruction, from the CLI through the admin endpoint.
type Command string

// Operator commands.
const (
	Pause   Command = "pause"
	Resume  Command = "resume"
	Abort   Command = "abort"
	Promote Command = "promote"
)

// Apply runs an operator's command at now; ok is false when it does not apply to the phase (resuming a
// progressing rollout, pausing a finished one).
func (s State) Apply(c Command, now time.Time) (State, bool) {
	switch {
	case c == Pause && s.Phase == Progressing:
		s.Phase, s.Reason = Paused, "paused by an operator"
	case c == Resume && s.Phase == Paused:
		s.Phase, s.StepStarted, s.StepRequests, s.Reason = Progressing, now, 0, "resumed by an operator"
	case c == Resume && (s.Phase == RolledBack || s.Phase == Aborted):
		// The candidate was changed (or is tried again): it passes the compatibility gate again, then starts
		// from the first step.
		s.Phase, s.Step, s.StepStarted, s.StepRequests, s.Reason = Checking, 0, now, 0, "restarted by an operator"
		s.EvalBy, s.EvalUntil = "", time.Time{}
	case c == Abort && s.Phase != Aborted && s.Phase != Promoted:
		s.Phase, s.Reason = Aborted, "aborted by an operator"
	case c == Promote && s.Phase != Promoted:
		s.Phase, s.Reason = Promoted, "promoted by an operator"
	default:
		return s, false
	}
	return s, true
}

// Fingerprint names a plan by what makes it the same rollout: its candidate and its steps. A stored state of
// another fingerprint is a finished or replaced rollout, and the plan starts over. The baseline is left out:
// adding or reordering the model's other pools must not restart (or un-promote) a rollout.
func Fingerprint(plan *policies.RolloutPlan) string {
	var b strings.Builder
	if plan.Candidate != nil {
		fmt.Fprintf(&b, "pool=%s;", plan.Candidate.Name)
	} else {
		fmt.Fprintf(&b, "served=%s;", plan.CandidateServed)
	}
	for _, st := range plan.Steps {
		fmt.Fprintf(&b, "step=%g/%v/%d;", st.Share, st.MinDuration, st.MinRequests)
	}
	if plan.Shadow != nil {
		b.WriteString("shadow;") // adding or dropping a shadow phase is another rollout
	}
	if plan.Eval != nil {
		b.WriteString("eval;") // so is adding or dropping an eval gate (not editing its cases)
	}
	return fmt.Sprintf("%016x", xxh3.HashString(b.String()))
}
