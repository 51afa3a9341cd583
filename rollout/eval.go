package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

// Limits on what the eval gate reads from engines and webhooks (the policy's own servers, read with bounds
// anyway).
const (
	maxEvalAnswer  = 4 << 20
	maxWebhookBody = 1 << 20
)

// errInconclusive marks an eval run that says nothing of the candidate: the baseline or a webhook could not
// answer. The gate runs again later.
var errInconclusive = errors.New("eval gate inconclusive")

// EvalReport is one run of the eval gate: each arm's pass rate over the golden set, and the cases the candidate
// failed that the baseline passed.
type EvalReport struct {
	Cases     int     `json:"cases"`
	Candidate float64 `json:"candidate"` // pass rate, 0..1 (a webhook's scores count as fractions of a pass)
	Baseline  float64 `json:"baseline"`
	Margin    float64 `json:"margin"`
	// Regressed names up to 10 cases the candidate scored below the baseline on.
	Regressed []string `json:"regressed,omitempty"`
	// Errors counts the candidate's answers that were not 200 (each a failed case).
	Errors int `json:"errors,omitempty"`
}

// Passed says whether the candidate's pass rate is within the margin of the baseline's.
func (r EvalReport) Passed() bool { return r.Candidate >= r.Baseline-r.Margin-1e-9 }

// String is the report as a rollout's reason.
func (r EvalReport) String() string {
	s := fmt.Sprintf("candidate passed %.1f%% of %d cases, the baseline %.1f%% (margin %.1f points)",
		100*r.Candidate, r.Cases, 100*r.Baseline, 100*r.Margin)
	if len(r.Regressed) > 0 {
		s += "; worse on " + strings.Join(r.Regressed, ", ")
	}
	if r.Errors > 0 {
		s += fmt.Sprintf("; %d candidate answers were errors", r.Errors)
	}
	return s
}

// evalTarget is an engine of one arm and the model name it serves the arm as.
type evalTarget struct{ endpoint, model string }

// evalTargets lists each arm's engines: the candidate's pool (or, for a served-model candidate, the baseline's
// engines under the candidate's name) and the baseline's pools.
// (A loaded policy names every pool's served model: it defaults to the model's name.)
func evalTargets(plan *policies.RolloutPlan) (cand, base []evalTarget) {
	for _, p := range plan.Baseline {
		for _, ep := range p.Endpoints {
			base = append(base, evalTarget{ep, p.ServedModel})
			if plan.Candidate == nil {
				cand = append(cand, evalTarget{ep, plan.CandidateServed})
			}
		}
	}
	if plan.Candidate != nil {
		for _, ep := range plan.Candidate.Endpoints {
			cand = append(cand, evalTarget{ep, plan.CandidateServed})
		}
	}
	return cand, base
}

// evaluator runs a plan's golden set against both arms.
type evaluator struct{ client *http.Client }

// caseScore is one case's scores, or why it could not be scored.
type caseScore struct {
	candidate, baseline float64
	candidateErr        bool
	err                 error
}

// run asks both arms every case, Concurrency cases at a time, and scores them.
func (e evaluator) run(ctx context.Context, plan *policies.RolloutPlan) (EvalReport, error) {
	ev := plan.Eval
	cand, base := evalTargets(plan)
	if len(cand) == 0 || len(base) == 0 {
		return EvalReport{}, fmt.Errorf("%w: an arm has no endpoints", errInconclusive)
	}
	scores := make([]caseScore, len(ev.Cases))
	sem := make(chan struct{}, max(1, ev.Concurrency))
	var wg sync.WaitGroup
	for i := range ev.Cases {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			scores[i] = e.score(ctx, ev, &ev.Cases[i], cand[i%len(cand)], base[i%len(base)])
		})
	}
	wg.Wait()
	r := EvalReport{Cases: len(ev.Cases), Margin: ev.Margin}
	for i, s := range scores {
		if s.err != nil {
			return EvalReport{}, fmt.Errorf("%w: case %q: %w", errInconclusive, ev.Cases[i].Name, s.err)
		}
		r.Candidate += s.candidate
		r.Baseline += s.baseline
		if s.candidateErr {
			r.Errors++
		}
		if s.candidate < s.baseline && len(r.Regressed) < 10 {
			r.Regressed = append(r.Regressed, ev.Cases[i].Name)
		}
	}
	r.Candidate /= float64(r.Cases)
	r.Baseline /= float64(r.Cases)
	return r, nil
}

// score asks both arms one case and scores their answers: by the case's check, or by its webhook. Each answer
// and the webhook have Timeout each; a candidate that errs or runs out of time fails the case, a baseline or a
// webhook that does makes the run inconclusive.
func (e evaluator) score(ctx context.Context, ev *policies.EvalPlan, c *policies.EvalCasePlan, cand, base evalTarget) caseScore {
	baseAnswer, err := e.answer(ctx, ev, c, base)
	if err != nil {
		return caseScore{err: fmt.Errorf("the baseline's answer: %w", err)}
	}
	candAnswer, candErr := e.answer(ctx, ev, c, cand)
	if ctx.Err() != nil {
		return caseScore{err: ctx.Err()} // stopped, not a wrong answer
	}
	s := caseScore{candidateErr: candErr != nil}
	if c.Webhook == "" {
		s.baseline = passScore(c.Check(baseAnswer))
		if candErr == nil {
			s.candidate = passScore(c.Check(candAnswer))
		}
		return s
	}
	s.baseline, s.candidate, s.err = e.webhook(ctx, ev, c, baseAnswer, candAnswer)
	if candErr != nil {
		s.candidate = 0
	}
	return s
}

func passScore(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}

// answer asks one engine for the case's answer and returns its generated text.
func (e evaluator) answer(ctx context.Context, ev *policies.EvalPlan, c *policies.EvalCasePlan, t evalTarget) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ev.Timeout)
	defer cancel()
	path := "/v1/completions"
	if c.Chat {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+t.endpoint+path, bytes.NewReader(c.Body(t.model)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Infergate-Eval", "1") // the engine's logs can tell the golden set from clients
	resp, err := e.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEvalAnswer+1))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s answered %d", t.endpoint, resp.StatusCode)
	}
	if len(body) > maxEvalAnswer {
		return "", fmt.Errorf("%s answered over %d bytes", t.endpoint, maxEvalAnswer)
	}
	var text strings.Builder
	openai.OutputText(body, &text)
	return text.String(), nil
}

// webhookAsk is what a case's webhook is sent.
type webhookAsk struct {
	Case string `json:"case"`
	// Request is a shadow pair's request, as the candidate was asked it (golden cases leave it out).
	Request   json.RawMessage `json:"request,omitempty"`
	Baseline  string          `json:"baseline"`
	Candidate string          `json:"candidate"`
}

// webhook has a case's webhook score the pair of answers.
func (e evaluator) webhook(ctx context.Context, ev *policies.EvalPlan, c *policies.EvalCasePlan, base, cand string) (float64, float64, error) {
	return e.ask(ctx, ev.Timeout, c.Webhook, webhookAsk{Case: c.Name, Baseline: base, Candidate: cand})
}

// pair has the shadow pairs' judge score a copied request's two answers.
func (e evaluator) pair(ctx context.Context, ev *policies.EvalPlan, p director.ShadowPair) (float64, float64, error) {
	return e.ask(ctx, ev.Timeout, ev.ShadowPairs.Webhook, webhookAsk{Case: "shadow", Request: p.Request,
		Baseline: string(p.Baseline), Candidate: string(p.Candidate)})
}

// ask POSTs a pair to a judge and reads its scores.
func (e evaluator) ask(ctx context.Context, timeout time.Duration, url string, q webhookAsk) (float64, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b, err := json.Marshal(q)
	if err != nil {
		return 0, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxWebhookBody+1))
	if err != nil {
		return 0, 0, fmt.Errorf("webhook: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return parseWebhookScores(body)
}

// parseWebhookScores reads a webhook's {"baseline": s, "candidate": s}; both scores are required, from 0 to 1.
func parseWebhookScores(b []byte) (base, cand float64, err error) {
	if len(b) > maxWebhookBody {
		return 0, 0, fmt.Errorf("webhook answer over %d bytes", maxWebhookBody)
	}
	var s struct {
		Baseline  *float64 `json:"baseline"`
		Candidate *float64 `json:"candidate"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, 0, fmt.Errorf("webhook answer: %w", err)
	}
	if s.Baseline == nil || s.Candidate == nil {
		return 0, 0, errors.New("webhook answer: baseline and candidate scores are required")
	}
	for _, v := range []float64{*s.Baseline, *s.Candidate} {
		if math.IsNaN(v) || v < 0 || v > 1 {
			return 0, 0, fmt.Errorf("webhook answer: a score of %v is not between 0 and 1", v)
		}
	}
	return *s.Baseline, *s.Candidate, nil
}
