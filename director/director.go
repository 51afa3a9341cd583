// Package director makes the decisions around one request, between the ext_proc protocol (extproc) and the
// stages that decide: Route when the body is in — model, permission, output bound, admission, placement,
// in-flight count — and Settle when the response has ended — usage, cost, quota settlement, the picker's
// learning, the settle observers. Its extension points are small interfaces (Admission, picker.Picker,
// SettleObserver), where an admission queue, telemetry and rollouts plug in.
package director

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
)

// Admission reserves a request's estimate against the tenant's limits and settles the real usage later.
// *quota.Limiter is the Redis-backed one.
type Admission interface {
	Admit(ctx context.Context, r quota.Request) (*quota.Ticket, *quota.Rejection, error)
	Settle(t *quota.Ticket, tokens, costMicros int64)
}

// SettleObserver hears of every settled request exactly once (audit, telemetry, tests); it must not block.
type SettleObserver interface {
	Settled(Settlement)
}

// ObserverFunc adapts a function to SettleObserver.
type ObserverFunc func(Settlement)

// Settled implements SettleObserver.
func (f ObserverFunc) Settled(s Settlement) { f(s) }

// OnRouted is an observer of routed requests' settlements only (tests, and infergate's OnSettle hook).
func OnRouted(f func(Settlement)) SettleObserver {
	return ObserverFunc(func(s Settlement) {
		if s.Routed {
			f(s)
		}
	})
}

// Rollouts publishes, for each model whose policy has a rollout, the candidate's current share of its
// conversation groups (rollout.Controller); a model it has no share for sends the candidate nothing.
type Rollouts interface {
	Share(model string) float64
	// ArmSeed is the rollout's secret seed of the arms' hash, shared by every replica through the rollout's
	// state: a client that names its conversation cannot compute which arm the name falls in.
	ArmSeed(model string) uint64
	// ShadowShare is the share of the baseline's requests copied to the candidate: above 0 only while the
	// rollout is in its shadow phase.
	ShadowShare(model string) float64
}

// Options wire a Director to the stages.
type Options struct {
	Policies *policies.Store
	// Picker places requests and learns from them once they settle (default: picker.ForStore over Policies,
	// InFlight and Engines; infergate serve builds its own in gateway, with placements shared).
	Picker   picker.Picker
	InFlight *fleet.InFlight
	Engines  picker.EngineView
	// Admission, when set, enforces the tenants' quotas.
	Admission Admission
	Metrics   *Metrics
	Logger    *slog.Logger
	// Queue, when set, holds the requests of a policy with spec.admission that no endpoint has room for.
	Queue *admission.Queue
	// Observers hear of every request that reached routing: routed ones when they settle, refused ones at once.
	Observers []SettleObserver
	// Now is the clock of refusals' timing (default time.Now).
	Now func() time.Time
	// Rollouts, when set, gives each rolled-out model's candidate share (none: the candidate takes nothing).
	Rollouts Rollouts
	// Shadows, when set, receives copies of baseline requests for rollouts in their shadow phase.
	Shadows Shadows
}

// Director is safe for concurrent use.
type Director struct {
	opts     Options
	warnings *upstreamWarnings
	starts   startLatency
}

// New builds a Director; Policies is required, everything else has a default.
func New(o Options) *Director {
	if o.InFlight == nil {
		o.InFlight = &fleet.InFlight{}
	}
	if o.Picker == nil {
		o.Picker = picker.ForStore(o.Policies, o.InFlight, o.Engines)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if q := o.Queue; q != nil {
		// A reload keeps waiting requests (they are placed under the new policy); those of a model it removed
		// are answered at once.
		o.Policies.OnChange(func(snap *policies.Snapshot) {
			q.Retain(func(model string) bool { _, ok := snap.Model(model); return ok })
			q.KickAll()
		})
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Director{opts: o, warnings: &upstreamWarnings{now: o.Now, burst: upstreamWarnBurst}}
}

// Metrics returns the series the director records, which the protocol stage shares.
func (d *Director) Metrics() *Metrics { return d.opts.Metrics }

// Request is what Route decides on: a parsed body from an authenticated tenant.
type Request struct {
	Snapshot     *policies.Snapshot
	Tenant       *policies.Tenant
	Endpoint     openai.Endpoint
	Body         *openai.Request
	Conversation string // the policy's conversation header, for conversationTokens caps
	RequestID    string
	Started      time.Time
	// BodyBytes is the body the protocol stage holds for the request (the admission queue bounds their sum).
	BodyBytes int64
	// MaxQueueWait, when set, caps the request's wait in the admission queue: the protocol stage's own limit
	// (Envoy's message timeout in BUFFERED mode).
	MaxQueueWait time.Duration
	// RolloutArm is the arm a client asked for with the rollout header: honoured only for the plan's testers.
	RolloutArm string
	// EdgeRegion is the region of the Envoy that asked, when it is another region's (its ext_proc failed over
	// to this gateway, docs/regions.md): the request is placed from there. "" is this gateway's own.
	EdgeRegion string
}

// Route is a routed request: where it goes, what to change in its body, and what Settle needs.
type Route struct {
	Model    *policies.Model
	Decision picker.Decision
	// Edits are the body changes: the served model's name, include_usage for a stream that did not ask for
	// it, max_tokens when the request set none.
	Edits openai.Edits
	// RenameModel, when the policy answers with the requested name (spec.gateway.responseModel: requested), is
	// that name as a JSON string, for the response's "model".
	RenameModel []byte

	tenant    *policies.Tenant
	requestID string
	started   time.Time
	queued    time.Duration
	placed    time.Time // when a queueing policy's request was placed: its start latency runs from here
	endpoint  openai.Endpoint
	targets   policies.Targets
	prompt    int64 // estimated prompt tokens
	output    int64 // the output bound admission reserved: every sequence's (see choices)
	choices   int64 // the sequences the engine generates for the request (n, best_of)
	stream    bool
	ticket    *quota.Ticket
	inFlight  inFlight
	settled   bool
	split     picker.Split
	pair      bool   // a shadow copy was sent for pairing: the answer's text goes to Shadows.Answered
	from      string // Request.EdgeRegion
}

// PairsAnswer says the protocol stage should keep the answer's generated text (up to MaxPairedAnswer) for
// Outcome.AnswerText: the request's shadow copy is judged against it.
func (r *Route) PairsAnswer() bool { return r != nil && r.pair }

// Settled says the route's request has been settled: Settle accounts for a request once, and the protocol
// stage asks here rather than keeping a flag of its own.
func (r *Route) Settled() bool { return r.settled }

// Budgets are what is left of the tenant's rate limits after this request's admission (none without quotas).
func (r *Route) Budgets() []quota.Budget { return r.ticket.Budgets() }

// Pool is the x-infergate-pool value of the route.
func (r *Route) Pool() string {
	if f := r.Decision.Fallback; f != nil {
		return contract.FallbackPool(f.Name)
	}
	return r.Decision.Pool.Name
}

// Route decides where a request goes, filling rt (which the caller owns, so that routing allocates nothing
// of its own). From a nil error on, the request counts as routed: it is in flight until Settle. An error is a
// *Refusal.
func (d *Director) Route(ctx context.Context, req Request, rt *Route) error {
	if err := d.route(ctx, &req, rt); err != nil {
		d.refused(&req, rt, err)
		return err
	}
	return nil
}

func (d *Director) route(ctx context.Context, req *Request, rt *Route) *Refusal {
	body := req.Body
	*rt = Route{tenant: req.Tenant, requestID: req.RequestID, started: req.Started, endpoint: req.Endpoint,
		stream: body.Stream, from: req.EdgeRegion}
	model, ok := req.Snapshot.Model(body.Model)
	if !ok {
		return &Refusal{Reason: ModelNotFound, Model: body.Model, Tenant: req.Tenant.Name}
	}
	rt.Model, rt.targets = model, req.Snapshot.SLO(req.Tenant, model)
	if !req.Snapshot.AllowsName(req.Tenant, body.Model) {
		return &Refusal{Reason: ModelForbidden, Model: body.Model, Tenant: req.Tenant.Name}
	}
	rt.prompt = int64(body.EstimatePromptTokens())
	maxOut, inject, ok := outputBound(req.Snapshot, model, req.Endpoint, body, rt.prompt)
	if !ok {
		return &Refusal{Reason: OutputTooLarge, Model: model.Name, Tenant: req.Tenant.Name,
			MaxTokens: body.MaxTokens, ContextTokens: model.ContextTokens}
	}
	if limit := int64(req.Snapshot.Gateway().MaxChoices); body.Choices > limit {
		return &Refusal{Reason: TooManyChoices, Model: model.Name, Tenant: req.Tenant.Name, Choices: body.Choices, MaxChoices: limit}
	}
	// The engine generates every sequence up to the bound: admission reserves, and placement prices, them all.
	rt.choices = max(1, body.Choices)
	maxOut = quota.MulTokens(maxOut, rt.choices)
	rt.output = maxOut
	if err := d.admit(ctx, req, rt, maxOut); err != nil {
		return err
	}
	in := picker.Input{Tenant: req.Tenant, Model: model, Request: body, Queueing: d.queueing(req.Snapshot), OutputTokens: maxOut,
		Region: req.EdgeRegion}
	if req.Snapshot.Adapter(body.Model) {
		in.Adapter = body.Model
	}
	// An adapter runs on the baseline's engines under its own name: a candidate that is another served name
	// of those engines cannot serve it, so such requests stay off the split.
	if plan, ok := req.Snapshot.Rollout(model); ok && (in.Adapter == "" || plan.Candidate != nil) {
		in.Split = d.split(req, rt, plan)
	}
	dec, refusal := d.place(ctx, req, rt, in, maxOut)
	if refusal != nil {
		d.release(rt)
		return refusal
	}
	rt.Decision = dec
	if in.Queueing {
		rt.placed = d.opts.Now()
	}
	if served := dec.Served(); served != body.Model {
		rt.Edits.Model = served
	}
	// Chat and completions streams report usage only when asked; a Responses API stream always does.
	rt.Edits.IncludeUsage = body.Stream && !body.IncludeUsage &&
		(req.Endpoint == openai.EndpointChat || req.Endpoint == openai.EndpointCompletions)
	rt.Edits.MaxTokens = inject
	if in.Split != nil && dec.Arm == picker.ArmBaseline && dec.Fallback == nil {
		d.shadow(req, rt, in.Split)
	}
	if req.Snapshot.Gateway().ResponseModel == policies.ResponseModelRequested {
		rt.RenameModel, _ = json.Marshal(body.Model) // a string: cannot fail
	}
	d.count(&rt.inFlight, dec, req.Snapshot, req.Tenant, rt.Model) // counted already when the queue placed it
	return nil
}

// place picks where the request goes; when the policy queues and every endpoint is full, it waits for room.
func (d *Director) place(ctx context.Context, req *Request, rt *Route, in picker.Input, maxOut int64) (picker.Decision, *Refusal) {
	if in.Queueing && d.opts.Queue.Len(rt.Model.Name) > 0 {
		// Others wait already: room that frees goes to them in queue order, not to whoever comes next.
		return d.wait(ctx, req, rt, in, quota.AddTokens(rt.prompt, maxOut))
	}
	dec, err := d.opts.Picker.Pick(req.Snapshot, in)
	var nc *picker.NoCapacity
	switch {
	case err == nil:
		return dec, nil
	case in.Queueing && errors.As(err, &nc) && nc.Saturated:
		return d.wait(ctx, req, rt, in, quota.AddTokens(rt.prompt, maxOut))
	}
	return picker.Decision{}, &Refusal{Reason: NoCapacity, Model: rt.Model.Name, Tenant: req.Tenant.Name, Err: err}
}

// split is a rolled-out model's division of traffic for this request: the controller's share, or the arm a
// tester asked for.
func (d *Director) split(req *Request, rt *Route, plan *policies.RolloutPlan) *picker.Split {
	rt.split = picker.Split{Plan: plan}
	if req.Conversation != "" {
		rt.split.Conversation = xxh3.HashString(req.Conversation) | 1
	} else {
		rt.split.Conversation = req.Body.ConversationKey()
	}
	if d.opts.Rollouts != nil {
		rt.split.Share, rt.split.Seed = d.opts.Rollouts.Share(plan.Model.Name), d.opts.Rollouts.ArmSeed(plan.Model.Name)
	}
	rt.split.Ungrouped = xxh3.HashString(req.RequestID) | 1
	// A tester may pick the candidate only once it takes traffic (past its compatibility gate, not rolled back
	// or aborted), and the baseline at any time.
	switch {
	case !plan.Tester(req.Tenant):
	case req.RolloutArm == picker.ArmBaseline, req.RolloutArm == picker.ArmCandidate && rt.split.Share > 0:
		rt.split.Force = req.RolloutArm
	}
	return &rt.split
}

// UnknownModel is the model of a refused request that named none the policy knows.
const UnknownModel = "(unknown)"

// refused tells the observers of a request Route refused: it counts against goodput unless it was the
// tenant's doing.
func (d *Director) refused(req *Request, rt *Route, r *Refusal) {
	if len(d.opts.Observers) == 0 {
		return
	}
	model := r.Model
	if r.Reason == ModelNotFound {
		// The client's own string: unbounded, so it never becomes a label or an audit field.
		model = UnknownModel
	}
	st := Settlement{RequestID: req.RequestID, Tenant: req.Tenant.Name, Tier: policies.TierOf(req.Tenant), Model: model,
		Operation: req.Endpoint, Stream: req.Body.Stream, Outcome: r.outcome(), Started: req.Started, Targets: rt.targets}
	if !req.Started.IsZero() {
		st.Timing.E2E = max(0, d.opts.Now().Sub(req.Started))
	}
	d.notify(st)
}

// outputBound fixes the most output tokens the request can produce (policies.Snapshot.OutputBound), which
// admission reserves and SLO placement prices; inject, when the client asked none, is the bound to write into
// the body. prompt is the request's estimated prompt tokens, estimated once by Route.
func outputBound(snap *policies.Snapshot, model *policies.Model, ep openai.Endpoint, body *openai.Request, prompt int64) (maxOut, inject int64, ok bool) {
	maxOut, injected, ok := snap.OutputBound(model, ep != openai.EndpointEmbeddings, body.MaxTokens, prompt)
	if injected {
		inject = maxOut
	}
	return maxOut, inject, ok
}

// admit reserves the request's estimated tokens and cost against the tenant's quotas.
func (d *Director) admit(ctx context.Context, req *Request, rt *Route, maxOut int64) *Refusal {
	q := d.opts.Admission
	if q == nil {
		return nil
	}
	t, rej, err := q.Admit(ctx, quota.Request{Snapshot: req.Snapshot, Tenant: req.Tenant, Model: rt.Model,
		EstimatedTokens: quota.AddTokens(rt.prompt, maxOut), EstimatedCostMicros: quota.MicroUSD(rt.Model, rt.prompt, maxOut),
		Conversation: req.Conversation})
	switch {
	case err != nil:
		return &Refusal{Reason: QuotaFailed, Model: rt.Model.Name, Tenant: req.Tenant.Name, Err: err}
	case rej != nil:
		return &Refusal{Reason: OverQuota, Model: rt.Model.Name, Tenant: req.Tenant.Name, Err: rej}
	}
	rt.ticket = t
	return nil
}

// release returns the reservation of a request that will not be sent.
func (d *Director) release(rt *Route) {
	if rt.ticket != nil {
		d.opts.Admission.Settle(rt.ticket, 0, 0)
		rt.ticket = nil
	}
}
