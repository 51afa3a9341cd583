package policies

import (
	"bytes"
	"encoding/json"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// RolloutEval is the eval gate: a golden set of prompts, each with a check of its answer, sent to both arms
// before the candidate takes any traffic (docs/rollouts.md). The rollout goes on only when the candidate's pass
// rate is at least the baseline's minus Margin; otherwise it is rolled back with no client request served by
// the candidate.
type RolloutEval struct {
	// Cases are the golden set (none: no evaluating phase, only ShadowPairs).
	Cases []EvalCase `yaml:"cases,omitempty" json:"cases,omitempty"`
	// Margin is how far below the baseline's pass rate the candidate's may be, as a fraction (default 0.05).
	Margin float64 `yaml:"margin,omitempty" json:"margin,omitempty" jsonschema:"minimum=0,maximum=1"`
	// Timeout bounds each answer and each webhook call (default "60s").
	Timeout string `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// Concurrency is how many cases run at once, each asking both arms (default 4).
	Concurrency int `yaml:"concurrency,omitempty" json:"concurrency,omitempty" jsonschema:"minimum=0"`
	// ShadowPairs, with a shadow phase, has a webhook judge pairs of real answers: for a sample of the copied
	// requests, the baseline's answer to the client and the candidate's to the copy. The first step needs
	// MinPairs judged, and the candidate's mean score within Margin of the baseline's.
	ShadowPairs *EvalShadowPairs `yaml:"shadowPairs,omitempty" json:"shadowPairs,omitempty"`
}

// EvalShadowPairs is where shadow pairs are judged and how many the shadow phase needs.
type EvalShadowPairs struct {
	// Webhook is an http(s) URL, POSTed {"case": "shadow", "request", "baseline", "candidate"} (the request as
	// the candidate was asked it) and answering {"baseline": s, "candidate": s}, each from 0 to 1. It receives
	// clients' prompts and answers: it must be a service trusted with them.
	Webhook string `yaml:"webhook" json:"webhook" jsonschema:"minLength=1"`
	// MinPairs is how many judged pairs the shadow phase needs before the first step (default 50).
	MinPairs int `yaml:"minPairs,omitempty" json:"minPairs,omitempty" jsonschema:"minimum=0"`
	// MaxConcurrent bounds the judge's calls in flight; a pair beyond it is not judged (default 4).
	MaxConcurrent int `yaml:"maxConcurrent,omitempty" json:"maxConcurrent,omitempty" jsonschema:"minimum=0"`
}

// EvalCase is one prompt of the golden set and the check its answer must pass: exactly one of exact, regex,
// jsonSchema and webhook.
type EvalCase struct {
	// Name names the case in reasons and reports.
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// Messages (a chat completion) or Prompt (a completion): what both arms are asked, at temperature 0.
	Messages []EvalMessage `yaml:"messages,omitempty" json:"messages,omitempty"`
	Prompt   string        `yaml:"prompt,omitempty" json:"prompt,omitempty"`
	// MaxTokens bounds each answer (default 256).
	MaxTokens int `yaml:"maxTokens,omitempty" json:"maxTokens,omitempty" jsonschema:"minimum=0"`
	// Exact: the answer, without surrounding white space, equals this.
	Exact *string `yaml:"exact,omitempty" json:"exact,omitempty"`
	// Regex: the answer matches this (Go RE2 syntax; anchor it to match all of it).
	Regex string `yaml:"regex,omitempty" json:"regex,omitempty"`
	// JSONSchema: the answer, without surrounding white space, is a JSON document this schema (draft 2020-12
	// unless it says otherwise) accepts.
	JSONSchema any `yaml:"jsonSchema,omitempty" json:"jsonSchema,omitempty" jsonschema:"type=object"`
	// Webhook is an http(s) URL that scores the pair of answers: it is POSTed {"case", "baseline",
	// "candidate"} and answers {"baseline": s, "candidate": s}, each score from 0 (fail) to 1 (pass).
	Webhook string `yaml:"webhook,omitempty" json:"webhook,omitempty"`
}

// EvalMessage is one chat message of an eval case.
type EvalMessage struct {
	// Role and Content are the message's, as the OpenAI API has them (system, user, assistant).
	Role    string `yaml:"role" json:"role"`
	Content string `yaml:"content" json:"content"`
}

// Eval gate defaults.
const (
	DefaultEvalMargin      = 0.05
	DefaultEvalTimeout     = 60 * time.Second
	DefaultEvalConcurrency = 4
	DefaultEvalMaxTokens   = 256
)

// EvalPlan is a rollout's eval gate, validated and compiled.
type EvalPlan struct {
	Cases       []EvalCasePlan
	Margin      float64
	Timeout     time.Duration
	Concurrency int
	// ShadowPairs is the shadow pairs' judge, defaults applied; nil without one.
	ShadowPairs *EvalShadowPairs
}

// Default shadow-pair bounds.
const (
	DefaultShadowPairs         = 50
	DefaultShadowPairsInFlight = 4
)

// EvalCasePlan is one compiled case.
type EvalCasePlan struct {
	Name string
	// Chat says whether the case is a chat completion (else a completion).
	Chat      bool
	messages  []EvalMessage
	prompt    string
	maxTokens int
	exact     *string
	regex     *regexp.Regexp
	schema    *jsonschema.Schema
	Webhook   string // set: the pair is scored by it, and Check is not used
}

// Body is the request that asks an engine serving model for the case's answer: deterministic (temperature 0),
// not streamed.
func (c *EvalCasePlan) Body(model string) []byte {
	req := map[string]any{"model": model, "max_tokens": c.maxTokens, "temperature": 0, "stream": false}
	if c.Chat {
		req["messages"] = c.messages
	} else {
		req["prompt"] = c.prompt
	}
	b, _ := json.Marshal(req) // strings, numbers and a slice of structs of strings always marshal
	return b
}

// Check says whether an answer passes the case's own check (exact, regex or JSON schema); a webhook case is
// scored in pairs instead, and Check fails it.
func (c *EvalCasePlan) Check(answer string) bool {
	trimmed := bytes.TrimSpace([]byte(answer))
	switch {
	case c.exact != nil:
		return string(trimmed) == *c.exact
	case c.regex != nil:
		return c.regex.MatchString(answer)
	case c.schema != nil:
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(trimmed))
		return err == nil && c.schema.Validate(doc) == nil
	}
	return false
}

// maxEvalCases bounds a golden set: each case is two generations per run.
const maxEvalCases = 10000

// compileEval resolves a validated eval gate; nil without one.
func compileEval(e *RolloutEval) *EvalPlan {
	if e == nil {
		return nil
	}
	plan := &EvalPlan{Margin: orDefault(e.Margin, DefaultEvalMargin), Timeout: durationOr(e.Timeout, DefaultEvalTimeout),
		Concurrency: e.Concurrency}
	if plan.Concurrency == 0 {
		plan.Concurrency = DefaultEvalConcurrency
	}
	for i := range e.Cases {
		c, _ := compileEvalCase(&e.Cases[i]) // validated: it compiles
		plan.Cases = append(plan.Cases, c)
	}
	if sp := e.ShadowPairs; sp != nil {
		pairs := *sp
		if pairs.MinPairs == 0 {
			pairs.MinPairs = DefaultShadowPairs
		}
		if pairs.MaxConcurrent == 0 {
			pairs.MaxConcurrent = DefaultShadowPairsInFlight
		}
		plan.ShadowPairs = &pairs
	}
	return plan
}

// compileEvalCase compiles one case; the error says what is wrong with its check.
func compileEvalCase(c *EvalCase) (EvalCasePlan, error) {
	out := EvalCasePlan{Name: c.Name, Chat: len(c.Messages) > 0, messages: slices.Clone(c.Messages), prompt: c.Prompt,
		maxTokens: c.MaxTokens, exact: c.Exact, Webhook: c.Webhook}
	if out.maxTokens == 0 {
		out.maxTokens = DefaultEvalMaxTokens
	}
	var err error
	if c.Regex != "" {
		if out.regex, err = regexp.Compile(c.Regex); err != nil {
			return out, err
		}
	}
	if c.JSONSchema != nil {
		if out.schema, err = compileSchema(c.JSONSchema); err != nil {
			return out, err
		}
	}
	return out, nil
}

// compileSchema compiles a JSON schema written in the policy's YAML.
func compileSchema(v any) (*jsonschema.Schema, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{}) // a $ref reads neither files nor the network: the schema stands alone
	const id = "urn:infergate:eval-case"
	if err := c.AddResource(id, doc); err != nil {
		return nil, err
	}
	return c.Compile(id)
}

// oneLine flattens a multi-line error (the schema compiler's) into a policy problem's message.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// eval validates a rollout's eval gate.
func (v *validator) eval(e *RolloutEval, shadow bool, rb []seg) {
	if e == nil {
		return
	}
	eb := append(slices.Clone(rb), "eval")
	switch {
	case len(e.Cases) > maxEvalCases:
		v.fail(append(slices.Clone(eb), "cases"), "at most %d cases, got %d", maxEvalCases, len(e.Cases))
	case len(e.Cases) == 0 && e.ShadowPairs == nil:
		v.fail(eb, "set cases, shadowPairs or both")
	}
	if sp := e.ShadowPairs; sp != nil {
		pb := append(slices.Clone(eb), "shadowPairs")
		if !shadow {
			v.fail(pb, "shadow pairs need a shadow phase (rollout.shadow)")
		}
		v.webhookURL(append(slices.Clone(pb), "webhook"), sp.Webhook)
		if sp.MinPairs < 0 || sp.MaxConcurrent < 0 {
			v.fail(pb, "minPairs and maxConcurrent must not be negative")
		}
	}
	if e.Margin < 0 || e.Margin > 1 {
		v.fail(append(slices.Clone(eb), "margin"), "must be between 0 and 1, got %v", e.Margin)
	}
	if e.Concurrency < 0 {
		v.fail(append(slices.Clone(eb), "concurrency"), "must not be negative, got %d", e.Concurrency)
	}
	v.positiveDuration(append(slices.Clone(eb), "timeout"), e.Timeout)
	names := map[string]bool{}
	for i := range e.Cases {
		v.evalCase(&e.Cases[i], append(slices.Clone(eb), "cases", i), names)
	}
}

// evalCase validates one case of the golden set.
func (v *validator) evalCase(c *EvalCase, cb []seg, names map[string]bool) {
	switch {
	case c.Name == "":
		v.fail(append(slices.Clone(cb), "name"), "a case needs a name")
	case names[c.Name]:
		v.fail(append(slices.Clone(cb), "name"), "case %q is named twice", c.Name)
	}
	names[c.Name] = true
	if (len(c.Messages) == 0) == (c.Prompt == "") {
		v.fail(cb, "set exactly one of messages and prompt")
	}
	if c.MaxTokens < 0 {
		v.fail(append(slices.Clone(cb), "maxTokens"), "must not be negative, got %d", c.MaxTokens)
	}
	checks := 0
	for _, set := range []bool{c.Exact != nil, c.Regex != "", c.JSONSchema != nil, c.Webhook != ""} {
		if set {
			checks++
		}
	}
	if checks != 1 {
		v.fail(cb, "set exactly one check: exact, regex, jsonSchema or webhook")
	}
	if c.Webhook != "" {
		v.webhookURL(append(slices.Clone(cb), "webhook"), c.Webhook)
	}
	if _, err := compileEvalCase(c); err != nil {
		field := "regex"
		if c.JSONSchema != nil && c.Regex == "" {
			field = "jsonSchema"
		}
		v.fail(append(slices.Clone(cb), field), "%s", oneLine(err))
	}
}

// webhookURL checks a judge's address: an absolute http(s) URL.
func (v *validator) webhookURL(path []seg, s string) {
	if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.fail(path, "must be an http or https URL, got %q", s)
	}
}
