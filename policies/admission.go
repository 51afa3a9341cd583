package policies

import "time"

// MinQueueWeight is the smallest tenant queueWeight: below it a tenant's fair-queuing tags would overflow.
const MinQueueWeight = 0.001

// AdmissionSettings is spec.admission with its defaults; Enabled is false when the policy has none, and then a
// request no endpoint has room for is shed (or overflows) at once.
type AdmissionSettings struct {
	Enabled                bool
	MaxQueueLength         int
	MaxQueueBytes          int64
	MaxQueueWait           time.Duration
	BufferedMessageTimeout time.Duration
}

// QueueClass is how a tenant's requests wait in the admission queue.
type QueueClass struct {
	Tier     string
	Priority int
	// Weight is the tenant's weight against its tier's other tenants.
	Weight float64
	// MinShare is the tier's reserved share of the queue's starts.
	MinShare float64
	// Headroom is the share of routing.maxWaiting the tier may fill on an endpoint (1: all of it).
	Headroom float64
}

type queueRules struct {
	class   QueueClass
	maxWait time.Duration // the tier's own, 0 when it sets none
	degrade map[*Model]*Model
}

// Admission returns the admission queue's settings.
func (s *Snapshot) Admission() AdmissionSettings { return s.admission }

// QueueClass returns where a tenant's requests stand in the admission queue.
func (s *Snapshot) QueueClass(t *Tenant) QueueClass {
	if r, ok := s.queueRules[t]; ok {
		return r.class
	}
	return QueueClass{Tier: TierOf(t), Weight: 1, Headroom: 1}
}

// MaxQueueWait is the longest a tenant's request may wait for room before it is degraded or shed: the tier's
// maxQueueWait, never more than spec.admission.maxQueueWait. The director also ends the wait once what is left
// of the request's TTFT target is no more than the model's requests take from leaving the queue to their
// first token.
func (s *Snapshot) MaxQueueWait(t *Tenant) time.Duration {
	limit := s.admission.MaxQueueWait
	if r, ok := s.queueRules[t]; ok && r.maxWait > 0 {
		return min(r.maxWait, limit)
	}
	return limit
}

// DegradeTo is the cheaper model a tenant's tier sends a request for m to when m has no room in time.
func (s *Snapshot) DegradeTo(t *Tenant, m *Model) (*Model, bool) {
	to, ok := s.queueRules[t].degrade[m]
	return to, ok
}

// Tenant finds a tenant by name: a request queued under an older policy is placed under the live one as its
// tenant now reads.
func (s *Snapshot) Tenant(name string) (*Tenant, bool) {
	for i := range s.Policy.Spec.Tenants {
		if t := &s.Policy.Spec.Tenants[i]; t.Name == name {
			return t, true
		}
	}
	return nil, false
}

// compileAdmission fills the admission defaults and each tenant's queue class.
func (s *Snapshot) compileAdmission(pol *Policy) {
	s.queueRules = map[*Tenant]queueRules{}
	if a := pol.Spec.Admission; a != nil {
		s.admission = AdmissionSettings{Enabled: true, MaxQueueLength: a.MaxQueueLength, MaxQueueBytes: a.MaxQueueBytes,
			MaxQueueWait:           parsePositive(a.MaxQueueWait, DefaultMaxQueueWait),
			BufferedMessageTimeout: parsePositive(a.BufferedMessageTimeout, DefaultBufferedMessageTimeout)}
		if s.admission.MaxQueueLength == 0 {
			s.admission.MaxQueueLength = DefaultMaxQueueLength
		}
		if s.admission.MaxQueueBytes == 0 {
			s.admission.MaxQueueBytes = DefaultMaxQueueBytes
		}
	}
	for i := range pol.Spec.Tenants {
		t := &pol.Spec.Tenants[i]
		r := queueRules{class: QueueClass{Tier: TierOf(t), Weight: t.QueueWeight, Headroom: 1}}
		if r.class.Weight <= 0 {
			r.class.Weight = 1
		}
		if tier, ok := pol.Spec.Tiers[t.Tier]; ok {
			r.class.Priority, r.class.MinShare = tier.Priority, tier.MinShare
			if tier.Headroom > 0 {
				r.class.Headroom = tier.Headroom
			}
			r.maxWait = parsePositive(tier.MaxQueueWait, 0)
			for _, d := range tier.DegradeTo {
				if r.degrade == nil {
					r.degrade = map[*Model]*Model{}
				}
				r.degrade[s.models[d.Model]] = s.models[d.To]
			}
		}
		s.queueRules[t] = r
	}
}

// parsePositive is a validated duration field, or def when it is empty.
func parsePositive(v string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	return def
}
