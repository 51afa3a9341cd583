package policies

import (
	"encoding/hex"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker/scorers"
)

// validator checks the meaning of a decoded policy and locates each problem in the YAML node tree.
type validator struct {
	file     string
	root     *yaml.Node
	problems []Problem
}

// seg is one step of a path into the document: a mapping key (string) or a sequence index (int).
type seg = any

// at finds the node for a path, or the deepest existing ancestor, so a missing field points at its parent.
func (v *validator) at(path []seg) *yaml.Node {
	n := v.root
	for _, s := range path {
		next := child(n, s)
		if next == nil {
			return n
		}
		n = next
	}
	return n
}

func child(n *yaml.Node, s seg) *yaml.Node {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch k := s.(type) {
	case string:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				return n.Content[i+1]
			}
		}
	case int:
		if n.Kind == yaml.SequenceNode && k < len(n.Content) {
			return n.Content[k]
		}
	}
	return nil
}

func pathString(path []seg) string {
	var b strings.Builder
	for _, s := range path {
		switch k := s.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k)
		case int:
			b.WriteString("[" + strconv.Itoa(k) + "]")
		}
	}
	return b.String()
}

func (v *validator) fail(path []seg, format string, args ...any) {
	n := v.at(path)
	p := Problem{File: v.file, Path: pathString(path), Message: fmt.Sprintf(format, args...)}
	if n != nil {
		p.Line, p.Column = n.Line, n.Column
	}
	v.problems = append(v.problems, p)
}

// p builds a path without the caller having to spell []seg{...}.
func p(parts ...seg) []seg { return parts }

func (v *validator) policy(pol *Policy) {
	if pol.APIVersion != APIVersion {
		v.fail(p("apiVersion"), "must be %q, got %q", APIVersion, pol.APIVersion)
	}
	if pol.Kind != Kind {
		v.fail(p("kind"), "must be %q, got %q", Kind, pol.Kind)
	}
	s := &pol.Spec
	v.gateway(&s.Gateway)
	if len(s.HardwareClasses) == 0 {
		v.fail(p("spec", "hardwareClasses"), "at least one hardware class is required")
	}
	for _, name := range slices.Sorted(maps.Keys(s.HardwareClasses)) {
		hc := s.HardwareClasses[name]
		base := p("spec", "hardwareClasses", name)
		if hc.CostPerHour < 0 {
			v.fail(append(base, "costPerHour"), "must not be negative, got %v", hc.CostPerHour)
		}
		if hc.PrefillTokensPerSecond <= 0 {
			v.fail(append(base, "prefillTokensPerSecond"), "must be greater than zero, got %v", hc.PrefillTokensPerSecond)
		}
		if hc.DecodeTokensPerSecond <= 0 {
			v.fail(append(base, "decodeTokensPerSecond"), "must be greater than zero, got %v", hc.DecodeTokensPerSecond)
		}
		v.gpu(base, hc)
	}
	modelNames := v.models(s)
	v.tiers(s, modelNames)
	v.slo(p("spec", "slo"), s.SLO, modelNames)
	v.retention(p("spec", "audit", "retention"), s.Audit.Retention)
	for i, t := range s.Tenants {
		v.retention(p("spec", "tenants", i, "auditRetention"), t.AuditRetention)
	}
	v.tenants(s, modelNames)
	v.admission(s.Admission)
	for i, t := range s.Tenants {
		if t.QueueWeight < 0 || (t.QueueWeight > 0 && t.QueueWeight < MinQueueWeight) {
			v.fail(p("spec", "tenants", i, "queueWeight"), "must be 0 (the default, 1) or at least %v, got %v", MinQueueWeight, t.QueueWeight)
		}
	}
	v.quotaSettings(&s.Quotas)
	v.routing(&s.Routing)
	v.regions(s)
}

func (v *validator) routing(r *Routing) {
	base := p("spec", "routing")
	if r.MaxWaiting < 0 {
		v.fail(append(base, "maxWaiting"), "must not be negative, got %d", r.MaxWaiting)
	}
	if r.MaxKVUtilisation < 0 || r.MaxKVUtilisation > 1 {
		v.fail(append(base, "maxKVUtilisation"), "must be between 0 and 1, got %v", r.MaxKVUtilisation)
	}
	v.weights(r)
	if r.BoundedLoadEpsilon < 0 {
		v.fail(append(base, "boundedLoadEpsilon"), "must not be negative, got %v", r.BoundedLoadEpsilon)
	}
	if r.Placement != "" && r.Placement != PlacementSLO && r.Placement != PlacementAffinity {
		v.fail(append(base, "placement"), "must be %q or %q, got %q", PlacementSLO, PlacementAffinity, r.Placement)
	}
	if r.SLOMargin < 0 || r.SLOMargin > 1 {
		v.fail(append(base, "sloMargin"), "must be between 0 and 1, got %v", r.SLOMargin)
	}
}

// weights checks routing.weights against the scorer table, and the older weight fields that stand for the same
// scorers.
func (v *validator) weights(r *Routing) {
	base := p("spec", "routing")
	for _, name := range slices.Sorted(maps.Keys(r.Weights)) {
		w := r.Weights[name]
		switch {
		case !scorers.Known(name):
			v.fail(append(slices.Clone(base), "weights", name), "unknown scorer %q; the scorers are %s", name, strings.Join(scorers.Names(scorers.Default), ", "))
		case w < 0 || math.IsNaN(w) || math.IsInf(w, 0):
			v.fail(append(slices.Clone(base), "weights", name), "must be a finite number, not negative, got %v", w)
		}
	}
	older := []struct {
		field, scorer string
		set           bool
		w             float64
	}{
		{"prefixWeight", "prefix", r.PrefixWeight != 0, r.PrefixWeight},
		{"loadWeight", "load", r.LoadWeight != 0, r.LoadWeight},
		{"prefillWeight", "prefill", r.PrefillWeight != nil, deref(r.PrefillWeight)},
		{"loraWeight", "lora", r.LoRAWeight != nil, deref(r.LoRAWeight)},
	}
	for _, o := range older {
		if !o.set {
			continue
		}
		if o.w < 0 {
			v.fail(append(slices.Clone(base), o.field), "must not be negative, got %v", o.w)
		}
		if _, both := r.Weights[o.scorer]; both {
			v.fail(append(slices.Clone(base), o.field), "states the weight weights.%s states too; keep weights.%s", o.scorer, o.scorer)
		}
	}
}

func deref(w *float64) float64 {
	if w == nil {
		return 0
	}
	return *w
}

func (v *validator) tiers(s *Spec, models map[string]bool) {
	for _, name := range slices.Sorted(maps.Keys(s.Tiers)) {
		tier := s.Tiers[name]
		base := p("spec", "tiers", name)
		for j, c := range tier.HardwareClasses {
			if _, ok := s.HardwareClasses[c]; !ok {
				v.fail(append(slices.Clone(base), "hardwareClasses", j), "unknown hardware class %q", c)
			}
		}
		for j, m := range tier.Models {
			if !models[m] {
				v.fail(append(slices.Clone(base), "models", j), "unknown model %q", m)
			}
		}
		v.slo(append(slices.Clone(base), "slo"), tier.SLO, models)
		v.queueTier(base, &tier, s, models)
	}
	v.reserves(s)
}

// reserveMargin is how far above 1 the reserves of a pool may add up by floating-point rounding alone.
const reserveMargin = 1e-9

// reserves checks the tiers' reserve: shares between 0 and 1 of known models that the tier may use, one per
// model, that can bind (admission on, a tier of lower priority, room past the tier's own headroom, a pool it
// may use that states maxConcurrency), and that add up to at most 1 on each pool, since the tiers that may use
// a pool share its endpoints' slots.
func (v *validator) reserves(s *Spec) {
	canonical := canonicalNames(s)
	lowest := math.MaxInt
	for _, tier := range s.Tiers {
		lowest = min(lowest, tier.Priority)
	}
	onPool := map[*Pool][]string{}
	totals := map[*Pool]float64{}
	for _, name := range slices.Sorted(maps.Keys(s.Tiers)) {
		tier := s.Tiers[name]
		seen := map[string]bool{}
		for _, model := range slices.Sorted(maps.Keys(tier.Reserve)) {
			at, share, base := p("spec", "tiers", name, "reserve", model), tier.Reserve[model], canonical[model]
			problem := reserveProblem(s, canonical, name, &tier, base, share, seen[base], lowest)
			if base != "" {
				seen[base] = true
			}
			if problem != "" {
				v.fail(at, "%s", problem)
				continue
			}
			for _, pool := range reservedPools(s, &tier, base) {
				totals[pool] += share
				onPool[pool] = append(onPool[pool], fmt.Sprintf("%s %v", name, share))
			}
		}
	}
	for _, m := range s.Models {
		for i := range m.Pools {
			if pool := &m.Pools[i]; totals[pool] > 1+reserveMargin {
				v.fail(p("spec", "tiers"), "the reserves on pool %q of model %q (%s) add up to %.4g: they share its endpoints' slots, so at most 1",
					pool.Name, m.Name, strings.Join(onPool[pool], ", "), totals[pool])
			}
		}
	}
}

// reservedPools are the pools of model base a tier's reserve holds on: those that state maxConcurrency and that
// the tier may use.
func reservedPools(s *Spec, tier *Tier, base string) []*Pool {
	var pools []*Pool
	for i := range s.Models {
		if m := &s.Models[i]; m.Name == base {
			for j := range m.Pools {
				if pool := &m.Pools[j]; pool.MaxConcurrency > 0 && coversPool(tier.HardwareClasses, tier.Residency, pool) {
					pools = append(pools, pool)
				}
			}
		}
	}
	return pools
}

// reserveProblem is what is wrong with one tier's reserve of a model (base: its canonical name, "" when
// unknown), or "".
func reserveProblem(s *Spec, canonical map[string]string, name string, tier *Tier, base string, share float64, again bool, lowest int) string {
	switch {
	case base == "":
		return "unknown model (a reserve names a base model or its alias, not an adapter)"
	case again:
		return fmt.Sprintf("model %q is reserved already, by its name or an alias", base)
	case !(share > 0 && share <= 1): // NaN too
		return fmt.Sprintf("must be above 0 and at most 1, got %v", share)
	case len(tier.Models) > 0 && !slices.ContainsFunc(tier.Models, func(n string) bool { return canonical[n] == base }):
		return fmt.Sprintf("the tier may not use %q (it is not in its models)", base)
	case tier.Headroom > 0 && tier.Headroom < 1 && share <= 1-tier.Headroom:
		return fmt.Sprintf("lower tiers may fill 1 − %v of an endpoint, and the tier's own headroom %v stops it there: the reserve gives it nothing",
			share, tier.Headroom)
	case s.Admission == nil:
		return "a reserve needs spec.admission: without the queue no tier is held back"
	case len(reservedPools(s, tier, base)) == 0:
		return fmt.Sprintf("no pool of model %q that the tier may use states maxConcurrency: there are no slots to reserve", base)
	case tier.Priority == lowest:
		return fmt.Sprintf("no tier has a lower priority than %s's %d: a reserve binds only those", name, tier.Priority)
	}
	return ""
}

// canonicalNames maps each model's name and aliases to its name.
func canonicalNames(s *Spec) map[string]string {
	canonical := map[string]string{}
	for _, m := range s.Models {
		canonical[m.Name] = m.Name
		for _, a := range m.Aliases {
			canonical[a] = m.Name
		}
	}
	return canonical
}

// queueTier checks a tier's admission fields.
func (v *validator) queueTier(base []seg, tier *Tier, s *Spec, models map[string]bool) {
	at := func(f ...seg) []seg { return append(slices.Clone(base), f...) }
	if tier.Priority < -1000 || tier.Priority > 1000 {
		v.fail(at("priority"), "must be between -1000 and 1000, got %d", tier.Priority)
	}
	if tier.MinShare < 0 || tier.MinShare > 0.5 {
		v.fail(at("minShare"), "must be between 0 and 0.5, got %v", tier.MinShare)
	}
	if tier.Headroom < 0 || tier.Headroom > 1 {
		v.fail(at("headroom"), "must be above 0 and at most 1, got %v", tier.Headroom)
	}
	v.target(at("maxQueueWait"), tier.MaxQueueWait)
	canonical := canonicalNames(s)
	seen := map[string]bool{}
	for j, d := range tier.DegradeTo {
		switch {
		case !models[d.Model]:
			v.fail(at("degradeTo", j, "model"), "unknown model %q", d.Model)
		case seen[canonical[d.Model]]:
			v.fail(at("degradeTo", j, "model"), "model %q degrades already", d.Model)
		case !models[d.To]:
			v.fail(at("degradeTo", j, "to"), "unknown model %q", d.To)
		case canonical[d.To] == "" || canonical[d.To] == canonical[d.Model]:
			v.fail(at("degradeTo", j, "to"), "must name another base model than %q", d.Model)
		case len(tier.Models) > 0 && !slices.ContainsFunc(tier.Models, func(n string) bool { return canonical[n] == canonical[d.To] }):
			v.fail(at("degradeTo", j, "to"), "the tier may not use %q (it is not in its models)", d.To)
		}
		seen[canonical[d.Model]] = true
	}
}

// admission checks spec.admission.
func (v *validator) admission(a *Admission) {
	if a == nil {
		return
	}
	base := p("spec", "admission")
	if a.MaxQueueLength < 0 {
		v.fail(append(slices.Clone(base), "maxQueueLength"), "must not be negative, got %d", a.MaxQueueLength)
	}
	if a.MaxQueueBytes < 0 || (a.MaxQueueBytes > 0 && a.MaxQueueBytes < 1024) {
		v.fail(append(slices.Clone(base), "maxQueueBytes"), "must be at least 1024, got %d", a.MaxQueueBytes)
	}
	v.target(append(slices.Clone(base), "maxQueueWait"), a.MaxQueueWait)
	if t := a.BufferedMessageTimeout; t != "" {
		if d, err := time.ParseDuration(t); err != nil || d <= BufferedWaitMargin {
			v.fail(append(slices.Clone(base), "bufferedMessageTimeout"),
				"must be a duration above %v (the margin a request leaves the queue before it), such as \"2s\", got %q",
				BufferedWaitMargin, t)
		}
	}
}

// slo checks an SLO's targets: durations of at least 1ms (a target below a millisecond cannot be met over a
// network), an objective strictly between 0 and 1, and model overrides naming known models once each.
func (v *validator) slo(base []seg, slo *SLO, models map[string]bool) {
	if slo == nil {
		return
	}
	v.target(append(slices.Clone(base), "ttft"), slo.TTFT)
	v.target(append(slices.Clone(base), "tpot"), slo.TPOT)
	if slo.Objective != 0 && (slo.Objective <= 0 || slo.Objective >= 1) {
		v.fail(append(slices.Clone(base), "objective"), "must be between 0 and 1 (exclusive), such as 0.99, got %v", slo.Objective)
	}
	seen := map[string]bool{}
	for j, ms := range slo.Models {
		at := append(slices.Clone(base), "models", j)
		switch {
		case !models[ms.Model]:
			v.fail(append(slices.Clone(at), "model"), "unknown model %q", ms.Model)
		case seen[ms.Model]:
			v.fail(append(slices.Clone(at), "model"), "model %q has targets already", ms.Model)
		}
		seen[ms.Model] = true
		v.target(append(slices.Clone(at), "ttft"), ms.TTFT)
		v.target(append(slices.Clone(at), "tpot"), ms.TPOT)
	}
}

func (v *validator) retention(path []seg, s string) {
	if s == "" {
		return
	}
	if d, err := time.ParseDuration(s); err != nil || d < time.Hour {
		v.fail(path, "must be a duration of at least 1h such as \"720h\" (30 days), got %q", s)
	}
}

func (v *validator) target(path []seg, s string) {
	if s == "" {
		return
	}
	if d, err := time.ParseDuration(s); err != nil || d < time.Millisecond {
		v.fail(path, "must be a duration of at least 1ms such as \"100ms\", got %q", s)
	}
}

func (v *validator) quotaSettings(q *QuotaSettings) {
	base := p("spec", "quotas")
	if q.FailMode != "" && q.FailMode != FailOpen && q.FailMode != FailClosed {
		v.fail(append(base, "failMode"), "must be %q or %q, got %q", FailOpen, FailClosed, q.FailMode)
	}
	if q.RedisTimeout != "" {
		if d, err := time.ParseDuration(q.RedisTimeout); err != nil || d <= 0 {
			v.fail(append(base, "redisTimeout"), "must be a positive duration such as \"50ms\", got %q", q.RedisTimeout)
		}
	}
	if q.GatewayReplicas < 0 {
		v.fail(append(base, "gatewayReplicas"), "must not be negative, got %d", q.GatewayReplicas)
	}
	if f := q.LeaseFraction; f != nil && (*f < 0 || *f > 0.5) {
		v.fail(append(base, "leaseFraction"), "must be between 0 and 0.5, got %v", *f)
	}
	if h := q.ConversationHeader; h != "" && (h != strings.ToLower(h) || strings.ContainsAny(h, " :")) {
		v.fail(append(base, "conversationHeader"), "must be a lower-case header name, got %q", h)
	}
}

func (v *validator) quota(path []seg, q Quota) {
	if q.RequestsPerSecond < 0 {
		v.fail(append(path, "requestsPerSecond"), "must not be negative, got %v", q.RequestsPerSecond)
	}
	if q.TokensPerMinute < 0 {
		v.fail(append(path, "tokensPerMinute"), "must not be negative, got %d", q.TokensPerMinute)
	}
	if q.MaxConcurrent < 0 {
		v.fail(append(path, "maxConcurrent"), "must not be negative, got %d", q.MaxConcurrent)
	}
	if q.MonthlySpendUSD < 0 {
		v.fail(append(path, "monthlySpendUSD"), "must not be negative, got %v", q.MonthlySpendUSD)
	}
	if q.ConversationTokens < 0 {
		v.fail(append(path, "conversationTokens"), "must not be negative, got %d", q.ConversationTokens)
	}
}

func (v *validator) gateway(g *Gateway) {
	base := p("spec", "gateway")
	if g.MaxRequestBodyBytes != 0 && (g.MaxRequestBodyBytes < 1024 || g.MaxRequestBodyBytes > 64<<20) {
		v.fail(append(base, "maxRequestBodyBytes"), "must be between 1024 and %d, got %d", 64<<20, g.MaxRequestBodyBytes)
	}
	bodyLimit := g.MaxRequestBodyBytes
	if bodyLimit == 0 {
		bodyLimit = DefaultMaxRequestBodyBytes
	}
	if g.MaxBodyBytesInFlight != 0 && (g.MaxBodyBytesInFlight < bodyLimit || g.MaxBodyBytesInFlight > 16<<30) {
		v.fail(append(base, "maxBodyBytesInFlight"), "must be at least maxRequestBodyBytes (%d) and at most %d, got %d",
			bodyLimit, int64(16<<30), g.MaxBodyBytesInFlight)
	}
	if g.MaxEndpointsPerDecision < 0 || g.MaxEndpointsPerDecision > 16 {
		v.fail(append(base, "maxEndpointsPerDecision"), "must be between 1 and 16, got %d", g.MaxEndpointsPerDecision)
	}
	if g.DefaultMaxTokens < 0 {
		v.fail(append(base, "defaultMaxTokens"), "must not be negative, got %d", g.DefaultMaxTokens)
	}
	if g.MaxChoices < 0 || g.MaxChoices > 128 {
		v.fail(append(base, "maxChoices"), "must be between 1 and 128 (OpenAI's own bound on n), got %d", g.MaxChoices)
	}
	if m := g.ResponseModel; m != "" && m != ResponseModelServed && m != ResponseModelRequested {
		v.fail(append(base, "responseModel"), "must be %q or %q, got %q", ResponseModelServed, ResponseModelRequested, m)
	}
	if g.UpstreamIdleTimeout != "" {
		if d, err := time.ParseDuration(g.UpstreamIdleTimeout); err != nil || d < time.Second {
			v.fail(append(base, "upstreamIdleTimeout"), "must be a duration of at least 1s such as \"60s\", got %q", g.UpstreamIdleTimeout)
		}
	}
}

// models validates every model and returns the set of names and aliases clients may use.
func (v *validator) models(s *Spec) map[string]bool {
	known := map[string]bool{}
	if len(s.Models) == 0 {
		v.fail(p("spec", "models"), "at least one model is required")
	}
	for i := range s.Models {
		m := &s.Models[i]
		base := p("spec", "models", i)
		if m.Name == "" {
			v.fail(append(base, "name"), "is required")
		} else if known[m.Name] {
			v.fail(append(base, "name"), "model name %q is already used by another model or alias", m.Name)
		}
		known[m.Name] = true
		v.clientNames(append(slices.Clone(base), "aliases"), "alias", m.Aliases, known)
		v.clientNames(append(slices.Clone(base), "adapters"), "adapter", m.Adapters, known)
		if m.ContextTokens < 0 {
			v.fail(append(base, "contextTokens"), "must not be negative, got %d", m.ContextTokens)
		}
		if m.Pricing.InputPerMTok < 0 {
			v.fail(append(base, "pricing", "inputPerMTok"), "must not be negative, got %v", m.Pricing.InputPerMTok)
		}
		if m.Pricing.OutputPerMTok < 0 {
			v.fail(append(base, "pricing", "outputPerMTok"), "must not be negative, got %v", m.Pricing.OutputPerMTok)
		}
		v.pools(s, m, base)
		v.fallbacks(m, base)
		v.rollout(s, m, base)
	}
	return known
}

func (v *validator) pools(s *Spec, m *Model, base []seg) {
	if len(m.Pools) == 0 {
		v.fail(append(base, "pools"), "at least one pool is required")
	}
	v.disaggregation(m, base)
	poolNames := map[string]bool{}
	endpoints := map[string]string{}
	for j := range m.Pools {
		pl := &m.Pools[j]
		pb := append(slices.Clone(base), "pools", j)
		v.clusterName(append(pb, "name"), pl.Name, "pool", poolNames)
		if pl.HardwareClass == "" {
			v.fail(append(pb, "hardwareClass"), "is required")
		} else if _, ok := s.HardwareClasses[pl.HardwareClass]; !ok {
			v.fail(append(pb, "hardwareClass"), "unknown hardware class %q (define it under spec.hardwareClasses)", pl.HardwareClass)
		}
		if _, ok := fleet.DialectFor(pl.Engine); !ok {
			v.fail(append(pb, "engine"), "must be one of %s, got %q", strings.Join(fleet.EngineNames(), ", "), pl.Engine)
		}
		switch {
		case pl.Service != nil && len(pl.Endpoints) > 0:
			v.fail(append(pb, "service"), "name a service or list endpoints, not both")
		case pl.Service != nil:
			v.service(append(slices.Clone(pb), "service"), pl.Service)
		case len(pl.Endpoints) == 0:
			v.fail(append(pb, "endpoints"), "at least one endpoint is required (or a service to discover them from)")
		}
		if pl.MaxConcurrency < 0 {
			v.fail(append(slices.Clone(pb), "maxConcurrency"), "must not be negative, got %d", pl.MaxConcurrency)
		}
		if pl.PrefillTokensPerSecond < 0 {
			v.fail(append(slices.Clone(pb), "prefillTokensPerSecond"), "must not be negative, got %v", pl.PrefillTokensPerSecond)
		}
		if pl.DecodeTokensPerSecond < 0 {
			v.fail(append(slices.Clone(pb), "decodeTokensPerSecond"), "must not be negative, got %v", pl.DecodeTokensPerSecond)
		}
		for k, ep := range pl.Endpoints {
			ap, err := netip.ParseAddrPort(ep)
			switch {
			case err != nil:
				v.fail(append(pb, "endpoints", k), "%q is not an ip:port address", ep)
			case ap.Port() == 0:
				v.fail(append(pb, "endpoints", k), "%q has port 0", ep)
			case ap.Addr().IsUnspecified():
				v.fail(append(pb, "endpoints", k), "%q is an unspecified address", ep)
			default:
				canon := ap.String()
				if other, dup := endpoints[canon]; dup {
					v.fail(append(pb, "endpoints", k), "endpoint %s is already listed in pool %q of this model", canon, other)
				}
				endpoints[canon] = pl.Name
			}
		}
	}
}

// dnsLabel is a Kubernetes namespace or Service name (RFC 1123 label).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// service validates a discovered pool's Service reference.
func (v *validator) service(base []seg, r *ServiceRef) {
	if !dnsLabel.MatchString(r.Namespace) {
		v.fail(append(slices.Clone(base), "namespace"), "%q is not a Kubernetes namespace name", r.Namespace)
	}
	if !dnsLabel.MatchString(r.Name) {
		v.fail(append(slices.Clone(base), "name"), "%q is not a Kubernetes Service name", r.Name)
	}
	v.port(append(slices.Clone(base), "port"), r.Port)
	if r.EnginePort != "" {
		v.port(append(slices.Clone(base), "enginePort"), r.EnginePort)
		if r.EnginePort == r.Port {
			v.fail(append(slices.Clone(base), "enginePort"), "is the sidecar's port: the engine is reached on a port of its own")
		}
	}
}

// port validates an EndpointSlice port's name or number.
func (v *validator) port(path []seg, port string) {
	if n, err := strconv.Atoi(port); err == nil {
		if n < 1 || n > 65535 {
			v.fail(path, "port %d is out of range", n)
		}
	} else if !dnsLabel.MatchString(port) || len(port) > 15 {
		v.fail(path, "%q is neither a port number nor a port name", port)
	}
}

func (v *validator) fallbacks(m *Model, base []seg) {
	names := map[string]bool{}
	for j := range m.Fallbacks {
		f := &m.Fallbacks[j]
		fb := append(slices.Clone(base), "fallbacks", j)
		v.clusterName(append(fb, "name"), f.Name, "fallback", names)
		if u, err := url.Parse(f.BaseURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			v.fail(append(fb, "baseURL"), "%q is not an http(s) URL with a host", f.BaseURL)
		}
		if f.Model == "" {
			v.fail(append(fb, "model"), "is required (the provider's name for the model)")
		}
		if f.CAFile != "" && !strings.HasPrefix(f.CAFile, "/") {
			v.fail(append(fb, "caFile"), "must be an absolute path on Envoy's host, got %q", f.CAFile)
		}
		if kind, rest, ok := strings.Cut(f.APIKeyFrom, ":"); !ok || rest == "" || (kind != "env" && kind != "file") {
			v.fail(append(fb, "apiKeyFrom"), "must be env:NAME or file:/path, got %q", f.APIKeyFrom)
		}
		if len(f.When) == 0 {
			v.fail(append(fb, "when"), "at least one condition is required (%s, %s, %s)", WhenSaturated, WhenUnavailable, WhenSLO)
		}
		for k, w := range f.When {
			if w != WhenSaturated && w != WhenUnavailable && w != WhenSLO {
				v.fail(append(fb, "when", k), "must be %q, %q or %q, got %q", WhenSaturated, WhenUnavailable, WhenSLO, w)
			}
		}
		if f.Pricing.InputPerMTok < 0 || f.Pricing.OutputPerMTok < 0 {
			v.fail(append(fb, "pricing"), "prices must not be negative")
		}
	}
}

func (v *validator) tenants(s *Spec, models map[string]bool) {
	if len(s.Tenants) == 0 {
		v.fail(p("spec", "tenants"), "at least one tenant is required (requests without a known API key are refused)")
	}
	names := map[string]bool{}
	keys := map[string]string{}
	for i := range s.Tenants {
		t := &s.Tenants[i]
		base := p("spec", "tenants", i)
		if t.Name == "" {
			v.fail(append(base, "name"), "is required")
		} else if names[t.Name] {
			v.fail(append(base, "name"), "duplicate tenant name %q", t.Name)
		}
		names[t.Name] = true
		if len(t.APIKeys) == 0 {
			v.fail(append(base, "apiKeys"), "at least one key digest is required")
		}
		for j, k := range t.APIKeys {
			digest, ok := strings.CutPrefix(k, "sha256:")
			if raw, err := hex.DecodeString(digest); !ok || err != nil || len(raw) != 32 {
				v.fail(append(base, "apiKeys", j), "must be \"sha256:\" followed by 64 hex digits (hash the key with `infergate hash-key`)")
				continue
			}
			digest = strings.ToLower(digest)
			if other, dup := keys[digest]; dup {
				v.fail(append(base, "apiKeys", j), "API key digest is already assigned to tenant %q", other)
			}
			keys[digest] = t.Name
		}
		if _, ok := s.Tiers[t.Tier]; len(s.Tiers) > 0 && !ok {
			if t.Tier == "" {
				v.fail(append(base, "tier"), "is required when spec.tiers is defined")
			} else {
				v.fail(append(base, "tier"), "unknown tier %q (define it under spec.tiers)", t.Tier)
			}
		}
		if len(t.Models) == 0 {
			v.fail(append(base, "models"), "at least one model (or \"*\") is required")
		}
		for j, m := range t.Models {
			if m != "*" && !models[m] {
				v.fail(append(base, "models", j), "unknown model %q", m)
			}
		}
		v.quota(append(slices.Clone(base), "quota"), t.Quota)
		seenModel := map[string]bool{}
		for j, mq := range t.ModelQuotas {
			mb := append(slices.Clone(base), "modelQuotas", j)
			switch {
			case !models[mq.Model]:
				v.fail(append(mb, "model"), "unknown model %q", mq.Model)
			case seenModel[mq.Model]:
				v.fail(append(mb, "model"), "duplicate quota for model %q", mq.Model)
			}
			seenModel[mq.Model] = true
			v.quota(mb, mq.Quota)
		}
	}
}

// clientNames checks names clients may put in "model" (aliases, adapters): not empty, and unique across every
// model, alias and adapter seen so far (known, which it extends).
func (v *validator) clientNames(path []seg, what string, names []string, known map[string]bool) {
	for j, a := range names {
		switch {
		case a == "":
			v.fail(append(slices.Clone(path), j), "%s must not be empty", what)
		case known[a]:
			v.fail(append(slices.Clone(path), j), "%s %q is already used by another model, alias or adapter", what, a)
		}
		known[a] = true
	}
}

// clusterName checks a pool or fallback name, which becomes part of an Envoy cluster name, and records it in seen.
func (v *validator) clusterName(path []seg, name, kind string, seen map[string]bool) {
	switch {
	case name == "":
		v.fail(path, "is required")
	case !validName(name):
		v.fail(path, "%q must be lower-case letters, digits, '-', '_' or '.' (it names an Envoy cluster)", name)
	case seen[name]:
		v.fail(path, "duplicate %s name %q", kind, name)
	}
	seen[name] = true
}

// validName keeps pool and fallback names usable inside Envoy cluster names and metric labels.
func validName(s string) bool {
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '_' && r != '.' {
			return false
		}
	}
	return s != ""
}
