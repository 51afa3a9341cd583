package director

import (
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

// inFlight is a routed request's place in the in-flight counts (fleet.InFlight, which the picker's load reads,
// and the infergate_inflight_requests gauge). The director is their one owner: a request is counted once, when
// it is placed — by Route, or by the admission queue as it places a waiting request, so that the room it takes
// is counted before the queue tries the next — and uncounted once, when it settles or is dropped after its
// placement; each uncount frees room a waiting request may take.
type inFlight struct {
	target  string // the endpoint or fallback cluster counted
	held    string // the tier it is also counted under, when that tier has a reserve (fleet.InFlight.Hold)
	counted bool
}

// count counts a request placed on model against its target, and, on an endpoint of a model its tenant's tier
// reserves, under the tier (a managed fallback holds no reserve); a request counted already (placed from the
// queue) stays as it is.
func (d *Director) count(f *inFlight, dec picker.Decision, snap *policies.Snapshot, tenant *policies.Tenant, model *policies.Model) {
	if f.counted {
		return
	}
	target := dec.Target(model.Name)
	d.opts.InFlight.Start(target)
	f.held = ""
	if dec.Fallback == nil && snap.Reserve(tenant, model) > 0 {
		f.held = policies.TierOf(tenant)
		d.opts.InFlight.Hold(target, f.held)
	}
	d.opts.Metrics.InFlight.Inc()
	f.target, f.counted = target, true
}

// uncount ends a request's count, once, and offers its room to the model's waiting requests.
func (d *Director) uncount(f *inFlight, model string) {
	if !f.counted {
		return
	}
	f.counted = false
	if f.held != "" {
		d.opts.InFlight.Release(f.target, f.held) // before Done: a reserve is never seen both freed and still held
	}
	d.opts.InFlight.Done(f.target)
	d.opts.Metrics.InFlight.Dec()
	if d.opts.Queue != nil {
		d.opts.Queue.Kick(model) // its endpoint has room for a waiting request
	}
}
