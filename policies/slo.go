package policies

import (
	"slices"
	"time"
)

// NoTier is the tier label of tenants that name none.
const NoTier = "default"

// Targets are an SLO resolved for one tier and model. A zero target does not constrain; Set is false when no
// SLO applies at all, and then every successful request is good.
type Targets struct {
	TTFT, TPOT time.Duration
	Objective  float64
	Set        bool
}

// SLOEntry is one tier's targets for one model, for the series that publish them.
type SLOEntry struct {
	Tier    string
	Model   *Model
	Targets Targets
}

// TierOf is the tier a tenant's requests are reported under.
func TierOf(t *Tenant) string {
	if t == nil || t.Tier == "" {
		return NoTier
	}
	return t.Tier
}

// SLO returns the targets a tenant's request for a model must meet.
func (s *Snapshot) SLO(t *Tenant, m *Model) Targets {
	return s.slos[sloKey{TierOf(t), m}]
}

// SLOTable lists the targets of every tier a tenant is in, for every model, sorted by tier then model.
func (s *Snapshot) SLOTable() []SLOEntry { return s.sloTable }

type sloKey struct {
	tier  string
	model *Model
}

// compileSLOs resolves every tenant tier's SLO for every model: the tier's own, else spec.slo; a model entry
// overrides the targets it names.
func (s *Snapshot) compileSLOs(pol *Policy) {
	s.slos = map[sloKey]Targets{}
	var tiers []string
	for i := range pol.Spec.Tenants {
		if tier := TierOf(&pol.Spec.Tenants[i]); !slices.Contains(tiers, tier) {
			tiers = append(tiers, tier)
		}
	}
	slices.Sort(tiers)
	for _, tier := range tiers {
		slo := pol.Spec.SLO
		if t, ok := pol.Spec.Tiers[tier]; ok && t.SLO != nil {
			slo = t.SLO
		}
		for i := range pol.Spec.Models {
			m := &pol.Spec.Models[i]
			tg := resolveTargets(slo, m, s.models)
			s.slos[sloKey{tier, m}] = tg
			if tg.Set {
				s.sloTable = append(s.sloTable, SLOEntry{Tier: tier, Model: m, Targets: tg})
			}
		}
	}
}

func resolveTargets(slo *SLO, m *Model, models map[string]*Model) Targets {
	if slo == nil {
		return Targets{}
	}
	tg := Targets{TTFT: parseTarget(slo.TTFT), TPOT: parseTarget(slo.TPOT), Objective: slo.Objective, Set: true}
	if tg.Objective == 0 {
		tg.Objective = DefaultSLOObjective
	}
	for _, ms := range slo.Models {
		if models[ms.Model] != m {
			continue
		}
		if ms.TTFT != "" {
			tg.TTFT = parseTarget(ms.TTFT)
		}
		if ms.TPOT != "" {
			tg.TPOT = parseTarget(ms.TPOT)
		}
	}
	return tg
}

// parseTarget reads a validated target; "" is no target.
func parseTarget(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}

// AuditRetention is how long a tenant's rotated audit files are kept (0: forever): the tenant's own
// retention, else spec.audit.retention. An unknown tenant gets the policy-wide one.
func (s *Snapshot) AuditRetention(tenant string) time.Duration {
	for i := range s.Policy.Spec.Tenants {
		if t := &s.Policy.Spec.Tenants[i]; t.Name == tenant && t.AuditRetention != "" {
			return parseTarget(t.AuditRetention)
		}
	}
	return parseTarget(s.Policy.Spec.Audit.Retention)
}
