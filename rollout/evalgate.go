package rollout

import (
	"context"
	"fmt"
	"time"

	"github.com/infergate/infergate/policies"
)

// evalRetry is how long an inconclusive eval run waits before the gate runs again.
const evalRetry = time.Minute

// evalJob is this replica's run of a model's eval gate, under the lease it claimed (State.EvalUntil).
type evalJob struct {
	lease  time.Time
	cancel context.CancelFunc
	done   chan struct{}
	report EvalReport
	err    error
}

// finished says whether the run is over.
func (j *evalJob) finished() bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

// evalJobs are this replica's eval runs, by model; the Controller's mutex guards them.
type evalJobs map[string]*evalJob

// drop cancels and forgets a model's run.
func (j evalJobs) drop(model string) {
	if job, ok := j[model]; ok {
		job.cancel()
		delete(j, model)
	}
}

// followEval keeps this replica's eval runs in step with a saved state: a lease it just claimed starts a run, a
// lease it no longer holds (the phase moved on, or another replica took over) stops one.
func (c *Controller) followEval(plan *policies.RolloutPlan, to State) {
	model := plan.Model.Name
	job := c.evals[model]
	switch {
	case to.Phase != Evaluating || to.EvalBy != c.id:
		c.evals.drop(model)
	case job == nil || !job.lease.Equal(to.EvalUntil):
		c.evals.drop(model)
		ctx, cancel := context.WithCancel(context.Background())
		job = &evalJob{lease: to.EvalUntil, cancel: cancel, done: make(chan struct{})}
		c.evals[model] = job
		run := evaluator{client: c.opts.EvalClient}
		go func() {
			defer close(job.done)
			job.report, job.err = run.run(ctx, plan)
		}()
	}
}

// evaluating moves a rollout whose eval gate runs: this replica's finished run decides it (pass: traffic, or
// the shadow phase; fail: rollback; inconclusive: run again after evalRetry); without one, a replica claims the
// lease when it is free or has lapsed.
func (c *Controller) evaluating(plan *policies.RolloutPlan, st State, now time.Time) State {
	model := plan.Model.Name
	if job := c.evals[model]; job != nil && st.EvalBy == c.id && job.lease.Equal(st.EvalUntil) {
		if !job.finished() {
			return st
		}
		next := st
		if job.err != nil {
			next.EvalBy, next.EvalUntil = "", now.Add(evalRetry)
			next.Reason = fmt.Sprintf("%v; it runs again in %v", job.err, evalRetry)
			return next
		}
		c.evalReports[model] = job.report
		c.opts.Metrics.eval(model, "golden", job.report)
		if job.report.Passed() {
			return enterTraffic(plan, st, now, "the eval gate passed: "+job.report.String())
		}
		next.Phase, next.EvalBy, next.EvalUntil = RolledBack, "", time.Time{}
		next.Reason = "eval gate: " + job.report.String()
		return next
	}
	if now.Before(st.EvalUntil) {
		return st // another replica runs it, or an inconclusive run waits
	}
	next := st
	next.EvalBy, next.EvalUntil = c.id, now.Add(evalLease(plan.Eval))
	next.Reason = fmt.Sprintf("the eval gate runs %d cases against both arms", len(plan.Eval.Cases))
	return next
}

// evalLease is how long a run may take at most: every case's two answers and its webhook, Concurrency cases at a
// time, each to its timeout, and a minute more. A replica that dies holding the lease delays the gate by this.
func evalLease(e *policies.EvalPlan) time.Duration {
	rounds := (len(e.Cases) + e.Concurrency - 1) / max(1, e.Concurrency)
	return time.Duration(rounds)*3*e.Timeout + time.Minute
}
