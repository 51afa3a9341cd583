package policies

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"
)

// Snapshot is a validated, compiled policy. It is immutable once built: the request path reads it without
// locks and a reload swaps the whole pointer, so one request always sees one consistent policy.
type Snapshot struct {
	// Policy is the document as loaded, with defaults filled in. Treat it as read-only.
	Policy *Policy
	// Source is the file the policy came from; Version is a short content hash that names this policy in logs.
	Source   string
	Version  string
	LoadedAt time.Time

	models       map[string]*Model // canonical names, aliases and adapters
	adapters     map[string]bool   // names that are LoRA adapters
	tierRules    map[*Tenant]*tierRules
	tenantByKey  map[[sha256.Size]byte]*Tenant
	allowed      map[*Tenant]map[*Model]bool // nil inner map: every model
	adapterOK    map[*Tenant]map[string]bool // the adapters a tenant lists (every one with "*")
	everything   map[*Tenant]bool            // "*"
	modelQuota   map[*Tenant]map[*Model]Quota
	rollouts     map[*Model]*RolloutPlan
	redisTO      time.Duration
	upIdle       time.Duration
	slos         map[sloKey]Targets
	sloTable     []SLOEntry
	admission    AdmissionSettings
	queueRules   map[*Tenant]queueRules
	regions      regionTable
	residency    map[*Tenant][]string // tenants pinned to regions (Residency)
	residencyKey map[*Tenant]string
}

// compile builds the snapshot of a validated policy. It applies the defaults to the document first, once: every
// package reads the resolved values, from the document or the snapshot alike.
func compile(pol *Policy, source, version string, now time.Time) *Snapshot {
	applyDefaults(pol)
	s := &Snapshot{
		Policy:       pol,
		Source:       source,
		Version:      version,
		LoadedAt:     now,
		models:       map[string]*Model{},
		adapters:     map[string]bool{},
		tierRules:    map[*Tenant]*tierRules{},
		tenantByKey:  map[[sha256.Size]byte]*Tenant{},
		allowed:      map[*Tenant]map[*Model]bool{},
		adapterOK:    map[*Tenant]map[string]bool{},
		everything:   map[*Tenant]bool{},
		modelQuota:   map[*Tenant]map[*Model]Quota{},
		residency:    map[*Tenant][]string{},
		residencyKey: map[*Tenant]string{},
		redisTO:      DefaultRedisTimeout,
		upIdle:       DefaultUpstreamIdleTimeout,
	}
	if d, err := time.ParseDuration(pol.Spec.Quotas.RedisTimeout); err == nil && d > 0 {
		s.redisTO = d
	}
	if d, err := time.ParseDuration(pol.Spec.Gateway.UpstreamIdleTimeout); err == nil && d > 0 {
		s.upIdle = d
	}
	s.compileModels(pol)
	s.compileRegions(pol)
	for i := range pol.Spec.Tenants {
		s.compileTenant(pol, &pol.Spec.Tenants[i])
		s.compileResidency(pol, &pol.Spec.Tenants[i])
	}
	s.compileSLOs(pol)
	s.compileRollouts(pol)
	s.compileAdmission(pol)
	return s
}

// compileModels indexes the models by canonical name, alias and adapter.
func (s *Snapshot) compileModels(pol *Policy) {
	for i := range pol.Spec.Models {
		m := &pol.Spec.Models[i]
		s.models[m.Name] = m
		for _, a := range m.Aliases {
			s.models[a] = m
		}
		for _, a := range m.Adapters {
			s.models[a] = m
			s.adapters[a] = true
		}
	}
}

// compileTenant resolves one tenant: its keys, the models and adapters it may call, its tier's rules and its
// per-model quotas.
func (s *Snapshot) compileTenant(pol *Policy, t *Tenant) {
	for _, k := range t.APIKeys {
		var d [sha256.Size]byte
		raw, _ := hex.DecodeString(strings.TrimPrefix(k, "sha256:")) // validated already
		copy(d[:], raw)
		s.tenantByKey[d] = t
	}
	// A model's name or alias grants the base model; an adapter's name grants that adapter alone; "*" grants
	// every model and adapter. A tenant that lists only adapters has an empty (not nil) set of base models.
	set := map[*Model]bool{}
	for _, name := range t.Models {
		switch {
		case name == "*":
			s.everything[t] = true
		case s.adapters[name]:
			if s.adapterOK[t] == nil {
				s.adapterOK[t] = map[string]bool{}
			}
			s.adapterOK[t][name] = true
		default:
			set[s.models[name]] = true
		}
	}
	if s.everything[t] {
		set = nil
	}
	s.allowed[t] = set
	if tier, ok := pol.Spec.Tiers[t.Tier]; ok {
		rules := &tierRules{}
		for _, c := range tier.HardwareClasses {
			if rules.classes == nil {
				rules.classes = map[string]bool{}
			}
			rules.classes[c] = true
		}
		for _, name := range tier.Models {
			if rules.models == nil {
				rules.models = map[*Model]bool{}
			}
			rules.models[s.models[name]] = true
		}
		s.tierRules[t] = rules
	}
	for _, mq := range t.ModelQuotas {
		if s.modelQuota[t] == nil {
			s.modelQuota[t] = map[*Model]Quota{}
		}
		s.modelQuota[t][s.models[mq.Model]] = mq.Quota
	}
}

// Routing returns the picker's settings with defaults applied.
func (s *Snapshot) Routing() Routing { return s.Policy.Spec.Routing }

// QuotaSettings returns how quotas are enforced, with defaults applied.
func (s *Snapshot) QuotaSettings() QuotaSettings { return s.Policy.Spec.Quotas }

// LeaseFraction is the share of each limit gateways may lease from Redis, with the default applied.
func (s *Snapshot) LeaseFraction() float64 {
	if f := s.Policy.Spec.Quotas.LeaseFraction; f != nil {
		return *f
	}
	return DefaultLeaseFraction
}

// RedisTimeout bounds one Redis call on the request path.
func (s *Snapshot) RedisTimeout() time.Duration { return s.redisTO }

// UpstreamIdleTimeout is the route idle timeout Envoy applies to attempts to the pools.
func (s *Snapshot) UpstreamIdleTimeout() time.Duration { return s.upIdle }

// ModelQuota returns the tenant's extra quota on a model, if the policy sets one.
func (s *Snapshot) ModelQuota(t *Tenant, m *Model) (Quota, bool) {
	q, ok := s.modelQuota[t][m]
	return q, ok
}

// Gateway returns the gateway limits with defaults applied.
func (s *Snapshot) Gateway() Gateway { return s.Policy.Spec.Gateway }

// Model resolves a client-supplied model name, alias or adapter name to its canonical model.
func (s *Snapshot) Model(name string) (*Model, bool) {
	m, ok := s.models[name]
	return m, ok
}

// Adapter reports whether a client-supplied model name is a LoRA adapter (of the model Model returns).
func (s *Snapshot) Adapter(name string) bool { return s.adapters[name] }

// tierRules is a tier compiled for lookups; a nil set allows everything of its kind.
type tierRules struct {
	classes map[string]bool
	models  map[*Model]bool
}

// PoolAllowed reports whether the tenant may use a pool: its tier allows the pool's hardware class, and the pool
// is in its residency.
func (s *Snapshot) PoolAllowed(t *Tenant, p *Pool) bool {
	r := s.tierRules[t]
	return (r == nil || r.classes == nil || r.classes[p.HardwareClass]) && s.Resident(t, p.Region)
}

// TenantForKey finds the tenant owning a plaintext bearer key by its sha256 digest, so the policy never needs
// to hold keys in the clear.
func (s *Snapshot) TenantForKey(key string) (*Tenant, bool) {
	t, ok := s.tenantByKey[sha256.Sum256([]byte(key))]
	return t, ok
}

// Allows reports whether a tenant may call a model.
func (s *Snapshot) Allows(t *Tenant, m *Model) bool {
	set, ok := s.allowed[t]
	if !ok || (set != nil && !set[m]) {
		return false
	}
	return s.tierAllows(t, m)
}

// AllowsName reports whether a tenant may call a model by a name clients use: a model's name or alias is the
// base model (Allows), an adapter's name needs the adapter itself in the tenant's models (or "*").
func (s *Snapshot) AllowsName(t *Tenant, name string) bool {
	m, ok := s.models[name]
	if !ok {
		return false
	}
	if !s.adapters[name] {
		return s.Allows(t, m)
	}
	if !s.everything[t] && !s.adapterOK[t][name] {
		return false
	}
	return s.tierAllows(t, m)
}

// NamesFor lists what a tenant may call, as /v1/models shows it: each model it may use by its name and aliases,
// and each adapter it may use, in policy order.
func (s *Snapshot) NamesFor(t *Tenant) []string {
	var out []string
	for i := range s.Policy.Spec.Models {
		m := &s.Policy.Spec.Models[i]
		if s.Allows(t, m) {
			out = append(out, m.Name)
			out = append(out, m.Aliases...)
		}
		for _, a := range m.Adapters {
			if s.AllowsName(t, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// tierAllows applies the tenant's tier to a model: its model list, and at least one pool on hardware it may use.
func (s *Snapshot) tierAllows(t *Tenant, m *Model) bool {
	r := s.tierRules[t]
	if r == nil {
		return true
	}
	if r.models != nil && !r.models[m] {
		return false
	}
	for i := range m.Pools {
		if m.Pools[i].ServesWhole() && s.PoolAllowed(t, &m.Pools[i]) {
			return true
		}
	}
	return false // the tier may use none of the model's hardware (a prefill-only pool takes no request of its own)
}

// PoolSpeed is how fast one replica of a pool runs its model: the pool's own figures where it states them,
// else its hardware class's, with the class's price.
type PoolSpeed struct {
	PrefillTokensPerSecond, DecodeTokensPerSecond, CostPerHour float64
}

// CostPerToken is the price of one generated token in USD at full decode throughput (the routing tie-break).
func (p PoolSpeed) CostPerToken() float64 {
	if p.DecodeTokensPerSecond <= 0 {
		return 0
	}
	return p.CostPerHour / 3600 / p.DecodeTokensPerSecond
}

// Speed returns a pool's speeds and price.
func (s *Snapshot) Speed(pool *Pool) PoolSpeed {
	hc := s.Policy.Spec.HardwareClasses[pool.HardwareClass]
	sp := PoolSpeed{PrefillTokensPerSecond: hc.PrefillTokensPerSecond, DecodeTokensPerSecond: hc.DecodeTokensPerSecond, CostPerHour: hc.CostPerHour}
	if pool.PrefillTokensPerSecond > 0 {
		sp.PrefillTokensPerSecond = pool.PrefillTokensPerSecond
	}
	if pool.DecodeTokensPerSecond > 0 {
		sp.DecodeTokensPerSecond = pool.DecodeTokensPerSecond
	}
	return sp
}

// HashKey returns the policy form ("sha256:<hex>") of a plaintext API key.
func HashKey(key string) string {
	d := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(d[:])
}
