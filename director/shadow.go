package director

import (
	"math"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

// Shadows takes copies of requests for a rollout's candidate in its shadow phase (shadow.Sender).
type Shadows interface {
	// Send starts a copy unless that would exceed the phase's bounds; it never waits, so the client whose
	// request is copied is not delayed. false: not sent.
	Send(c ShadowCopy) bool
	// Answered hands over the baseline's answer to a request whose copy was sent for pairing (ShadowCopy.Pair):
	// its generated text (bounded by MaxPairedAnswer), and whether it ended well. It never waits.
	Answered(requestID string, ok bool, text []byte)
}

// MaxPairedAnswer bounds the text kept of each side of a shadow pair.
const MaxPairedAnswer = 32 << 10

// ShadowPair is a copied request's two answers, the baseline's to the client and the candidate's to the copy,
// for the rollout's judge (policies.EvalShadowPairs).
type ShadowPair struct {
	Model, RequestID string
	// Request is the copy's body, as the candidate was asked.
	Request             []byte
	Baseline, Candidate []byte
}

// ShadowCopy is one request's copy for the candidate: its body as the candidate is asked for it, where it may
// go, and what the original is judged against, so that the copy's settlement compares with the original's.
type ShadowCopy struct {
	// RequestID is the baseline request's, so that the copy's audit line and span name what it copied.
	RequestID string
	// Pair says the rollout judges pairs of answers (policies.EvalShadowPairs): the copy's answer text is kept,
	// and the baseline's comes through Shadows.Answered.
	Pair        bool
	Model, Tier string
	Plan        *policies.ShadowPlan
	Endpoint    openai.Endpoint
	Stream      bool
	// Body builds the copy's body; Send calls it at most once, before it returns (the request's body is
	// released after the decision), and only for a copy it sends.
	Body func() []byte
	// Endpoints are the candidate's engines; HardwareClass and Provider theirs.
	Endpoints               []string
	HardwareClass, Provider string
	Targets                 policies.Targets
}

// shadow copies a baseline request to the candidate when the rollout is in its shadow phase and the request
// falls in the phase's sample (by the request id, keyed by the rollout's secret seed).
func (d *Director) shadow(req *Request, rt *Route, sp *picker.Split) {
	if d.opts.Shadows == nil || d.opts.Rollouts == nil {
		return
	}
	plan := sp.Plan
	share := d.opts.Rollouts.ShadowShare(plan.Model.Name)
	if share <= 0 || plan.Shadow == nil {
		return
	}
	u := float64(xxh3.HashSeed([]byte(req.RequestID), sp.Seed^0x5eed)>>11) / (1 << 53)
	if u >= math.Min(share, 1) {
		return
	}
	pools := plan.Baseline // a served-model candidate runs on the baseline's engines
	if plan.Candidate != nil {
		pools = []*policies.Pool{plan.Candidate}
	}
	c := ShadowCopy{RequestID: req.RequestID, Model: plan.Model.Name, Tier: policies.TierOf(req.Tenant), Plan: plan.Shadow, Endpoint: req.Endpoint,
		Stream: req.Body.Stream, Targets: rt.targets}
	for _, p := range pools {
		if !req.Snapshot.Resident(req.Tenant, p.Region) {
			continue // a copy is the tenant's data too: never outside its residency
		}
		c.Endpoints = append(c.Endpoints, p.Endpoints...)
		c.HardwareClass, c.Provider = p.HardwareClass, p.Engine
	}
	if len(c.Endpoints) == 0 {
		return
	}
	served := plan.CandidateServed
	if served == "" {
		served = plan.Model.Name
	}
	// The copy asks for the candidate's name and reports usage, so that its output length is known.
	edits := openai.Edits{Model: served, MaxTokens: rt.Edits.MaxTokens, IncludeUsage: req.Body.Stream && !req.Body.IncludeUsage &&
		(req.Endpoint == openai.EndpointChat || req.Endpoint == openai.EndpointCompletions)}
	c.Body = func() []byte { return req.Body.Rewrite(nil, edits) }
	c.Pair = plan.Eval != nil && plan.Eval.ShadowPairs != nil
	if d.opts.Shadows.Send(c) && c.Pair {
		rt.pair = true
	}
}
