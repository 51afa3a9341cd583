package director

import (
	"context"
	"time"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

// queueing says whether a request to snap's models waits for room rather than being shed at once.
func (d *Director) queueing(snap *policies.Snapshot) bool {
	return d.opts.Queue != nil && snap.Admission().Enabled
}

// wait holds a request that no endpoint has room for in the admission queue until one has (the request is then
// placed and counted in flight), and degrades or sheds it when it cannot start in time.
func (d *Director) wait(ctx context.Context, req *Request, rt *Route, in picker.Input, tokens int64) (picker.Decision, *Refusal) {
	snap, q := req.Snapshot, d.opts.Queue
	set, name := snap.Admission(), rt.Model.Name
	maxWait := snap.MaxQueueWait(req.Tenant)
	if req.MaxQueueWait > 0 {
		maxWait = min(maxWait, req.MaxQueueWait)
	}
	arrived := req.Started
	if arrived.IsZero() {
		arrived = d.opts.Now()
	}
	due, degradeBy := d.dueTimes(snap, req, rt, arrived)
	class := snap.QueueClass(req.Tenant)
	var placed *policies.Model
	var dec picker.Decision
	took := func(got picker.Decision, m *policies.Model, ok bool) bool {
		if ok {
			dec, placed = got, m
			d.count(&rt.inFlight, got, snap, req.Tenant, m) // before the queue tries the next request
		}
		return ok
	}
	elsewhere := func() bool { return took(d.elsewhere(snap, rt, in, arrived)) } // a cheaper model or the managed API
	cheaper := func() bool { return took(d.cheaper(snap, rt, in, arrived)) }
	e := &admission.Entry{Model: name, Tenant: req.Tenant.Name, Class: class, Cost: tokens, Bytes: req.BodyBytes,
		Deadline: arrived.Add(maxWait), Due: due, DegradeBy: degradeBy, Try: func() admission.TryResult {
			cur, tin := d.current(snap, in)
			m, ok := cur.Model(name)
			if !ok || tin.Tenant == nil || !cur.AllowsName(tin.Tenant, in.Request.Model) {
				return admission.Gone // a reload took the model or the tenant's right to it
			}
			tin.Model, tin.Waited = m, d.opts.Now().Sub(arrived)
			got, err := d.opts.Picker.Pick(cur, tin)
			if err != nil {
				return admission.NoRoom
			}
			dec, placed = got, m
			d.count(&rt.inFlight, got, cur, tin.Tenant, m) // before the queue tries the next request
			return admission.Placed
		}, Elsewhere: elsewhere, Degrade: cheaper}
	out := q.Wait(ctx, e, admission.Limits{Length: set.MaxQueueLength, Bytes: set.MaxQueueBytes})
	rt.queued = out.Waited
	switch out.Result {
	case admission.Started:
		if ctx.Err() != nil {
			// The client went away as its request was placed: it is not sent, and its room goes to the next.
			d.uncount(&rt.inFlight, name)
			return picker.Decision{}, &Refusal{Reason: ClientGone, Model: name, Tenant: req.Tenant.Name, Err: ctx.Err()}
		}
		rt.Model = placed
		return dec, nil
	case admission.Aborted:
		return picker.Decision{}, &Refusal{Reason: ClientGone, Model: name, Tenant: req.Tenant.Name, Err: ctx.Err()}
	case admission.Removed:
		return picker.Decision{}, &Refusal{Reason: ModelNotFound, Model: name, Tenant: req.Tenant.Name}
	case admission.Degraded:
		q.Metrics().Result(name, policies.TierOf(req.Tenant), "degraded", admission.Expired.String())
		if ctx.Err() != nil {
			d.uncount(&rt.inFlight, placed.Name)
			return picker.Decision{}, &Refusal{Reason: ClientGone, Model: name, Tenant: req.Tenant.Name, Err: ctx.Err()}
		}
		rt.Model = placed
		return dec, nil
	}
	return d.degrade(req, rt, in, out, arrived)
}

// dueTimes are when a queued request must start to reach its first token within its TTFT target (zero
// without one): due on its own model, degradeBy on the cheaper model its tier degrades it to, when that takes
// longer to a first token (zero otherwise). Each is the target less the start latency learnt on that model.
func (d *Director) dueTimes(snap *policies.Snapshot, req *Request, rt *Route, arrived time.Time) (due, degradeBy time.Time) {
	ttft := rt.targets.TTFT
	if ttft <= 0 {
		return time.Time{}, time.Time{}
	}
	// Started later than this, the request would reach its first token too late to be good: it waits on only
	// while requests of lower priority wait (admission/queue.go).
	now := d.opts.Now()
	own := d.starts.bound(rt.Model.Name, now)
	due = arrived.Add(max(0, ttft-own))
	// Sent to a slower cheaper model at its due time, it would be late there too: it goes there while it can
	// still be on time.
	if to, ok := snap.DegradeTo(req.Tenant, rt.Model); ok {
		if there := d.starts.bound(to.Name, now); there > own && there < ttft {
			degradeBy = arrived.Add(ttft - there)
		}
	}
	return due, degradeBy
}

// elsewhere places a request its own model has no room for in time on the cheaper model its tier names for
// this one (cheaper), or on the model's managed fallback, when the policy lets it take saturation; it returns
// the model the request is then served as.
func (d *Director) elsewhere(snap *policies.Snapshot, rt *Route, in picker.Input, arrived time.Time) (picker.Decision, *policies.Model, bool) {
	if dec, to, ok := d.cheaper(snap, rt, in, arrived); ok {
		return dec, to, true
	}
	if dec, ok := picker.SaturatedFallback(snap, in); ok {
		return dec, rt.Model, true
	}
	return picker.Decision{}, nil, false
}

// cheaper places a request on the cheaper model its tier names for its own, when that has room and can still
// serve it within its TTFT target.
func (d *Director) cheaper(snap *policies.Snapshot, rt *Route, in picker.Input, arrived time.Time) (picker.Decision, *policies.Model, bool) {
	to, ok := snap.DegradeTo(in.Tenant, rt.Model)
	if !ok || !d.inTimeOn(to.Name, rt, arrived) {
		return picker.Decision{}, nil, false
	}
	tin := in
	tin.Model, tin.Adapter, tin.Split = to, "", nil // another model: the rollout's split is not its own
	dec, err := d.opts.Picker.Pick(snap, tin)
	if err != nil {
		return picker.Decision{}, nil, false
	}
	return dec, to, true
}

// inTimeOn says whether a request that arrived at arrived can still reach its first token on model within its
// TTFT target, at the start latency learnt there (always, without a target). A cheaper model's room goes to
// requests it can serve in time: in an overload it is as full as the model it relieves, and a request sent
// there late would take the place of one that is not.
func (d *Director) inTimeOn(model string, rt *Route, arrived time.Time) bool {
	ttft, now := rt.targets.TTFT, d.opts.Now()
	return ttft <= 0 || !now.Add(d.starts.bound(model, now)).After(arrived.Add(ttft))
}

// current is the snapshot a queued request is placed under: the live one, with the tenant as it now reads
// (nil when a reload removed it), so a reload's pools apply to requests already waiting.
func (d *Director) current(snap *policies.Snapshot, in picker.Input) (*policies.Snapshot, picker.Input) {
	cur := d.opts.Policies.Current()
	if cur == snap || cur == nil {
		return snap, in
	}
	t, _ := cur.Tenant(in.Tenant.Name)
	in.Tenant = t
	return cur, in
}

// degrade finds a request that cannot start in time somewhere else to go: the cheaper model its tier names for
// this one, when that has room and can still serve it in time; the model's managed fallback, when the policy
// lets it take saturation; otherwise it is shed with a 429 whose retry-after is the queue's drain time.
func (d *Director) degrade(req *Request, rt *Route, in picker.Input, out admission.Outcome, arrived time.Time) (picker.Decision, *Refusal) {
	model, tier := rt.Model, policies.TierOf(req.Tenant)
	metrics, why := d.opts.Queue.Metrics(), out.Result.String()
	if dec, to, ok := d.elsewhere(req.Snapshot, rt, in, arrived); ok {
		metrics.Result(model.Name, tier, "degraded", why)
		rt.Model = to
		return dec, nil
	}
	metrics.Result(model.Name, tier, "shed", why)
	return picker.Decision{}, &Refusal{Reason: NoCapacity, Model: model.Name, Tenant: req.Tenant.Name,
		Err: &picker.NoCapacity{Model: model.Name, Saturated: true, RetryAfter: out.RetryAfter, Residency: req.Snapshot.Residency(req.Tenant)}}
}
