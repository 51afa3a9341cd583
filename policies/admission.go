package policies

import (
	"maps"
	"slices"
	"time"
)

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
	// Headroom is how full, as a share, an endpoint may be for the tier to add a request (1: full; see
	// Tier.Headroom).
	Headroom float64
}

// Reservation is one tier's reserve of a model's endpoints, as a lower tier must leave it.
type Reservation struct {
	Tier  string
	Share float64
	// classes and residency are the reserving tier's hardwareClasses and residency: it holds nothing on a pool
	// it may not use.
	classes, residency []string
}

// Covers says whether the reserve holds on pool: the reserving tier may place requests there. Elsewhere its
// requests never come, and the slots would idle.
func (r Reservation) Covers(pool *Pool) bool { return coversPool(r.classes, r.residency, pool) }

// coversPool says whether a tier with these hardwareClasses and residency may place requests on pool (empty:
// any), as the tier's part of Snapshot.PoolAllowed does.
func coversPool(classes, residency []string, pool *Pool) bool {
	return (len(classes) == 0 || slices.Contains(classes, pool.HardwareClass)) &&
		(len(residency) == 0 || pool.Region != "" && slices.Contains(residency, pool.Region))
}

type queueRules struct {
	class   QueueClass
	maxWait time.Duration // the tier's own, 0 when it sets none
	degrade map[*Model]*Model
	reserve map[*Model]float64       // the tier's own reserve by model
	above   map[*Model][]Reservation // the reserves of the tiers above it by model
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

// Reserve is the share of m's endpoints kept for a tenant's tier (0: none); its requests there are counted
// under the tier (fleet.InFlight.Hold), so that lower tiers leave free what they do not fill.
func (s *Snapshot) Reserve(t *Tenant, m *Model) float64 { return s.queueRules[t].reserve[m] }

// ReservedAbove are the reserves of m's endpoints of the tiers above a tenant's, which its requests leave free.
func (s *Snapshot) ReservedAbove(t *Tenant, m *Model) []Reservation { return s.queueRules[t].above[m] }

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
	s.reservationsAbove(pol)
}

// reservationsAbove gives each tenant its tier's reserves and those of the tiers above it, by model.
func (s *Snapshot) reservationsAbove(pol *Policy) {
	names := slices.Sorted(maps.Keys(pol.Spec.Tiers))
	for t, r := range s.queueRules {
		for _, name := range names {
			tier := pol.Spec.Tiers[name]
			for model, share := range tier.Reserve {
				m := s.models[model]
				switch {
				case m == nil || !(share > 0): // NaN too; validation refuses both
				case name == TierOf(t):
					r.reserve = setIn(r.reserve, m, share)
				case tier.Priority > r.class.Priority:
					held := Reservation{Tier: name, Share: share, classes: tier.HardwareClasses, residency: tier.Residency}
					r.above = setIn(r.above, m, append(r.above[m], held))
				}
			}
		}
		s.queueRules[t] = r
	}
}

// setIn sets k to v in m, making m if it is nil.
func setIn[K comparable, V any](m map[K]V, k K, v V) map[K]V {
	if m == nil {
		m = map[K]V{}
	}
	m[k] = v
	return m
}

// parsePositive is a validated duration field, or def when it is empty.
func parsePositive(v string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	return def
}
