package policies

import "github.com/infergate/infergate/picker/scorers"

// applyDefaults fills every field a policy left at zero with its default, in the document itself, once, when
// the snapshot is compiled: the snapshot's accessors and the document then read the same resolved values, and
// no package applies a default of its own.
func applyDefaults(pol *Policy) {
	spec := &pol.Spec
	routingDefaults(&spec.Routing)
	q := &spec.Quotas
	if q.FailMode == "" {
		q.FailMode = FailOpen
	}
	if q.GatewayReplicas == 0 {
		q.GatewayReplicas = DefaultGatewayReplicas
	}
	g := &spec.Gateway
	if g.MaxRequestBodyBytes == 0 {
		g.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if g.MaxBodyBytesInFlight == 0 {
		g.MaxBodyBytesInFlight = max(DefaultMaxBodyBytesInFlight, g.MaxRequestBodyBytes)
	}
	if g.MaxEndpointsPerDecision == 0 {
		g.MaxEndpointsPerDecision = DefaultMaxEndpointsPerDecision
	}
	if g.DefaultMaxTokens == 0 {
		g.DefaultMaxTokens = DefaultMaxTokens
	}
	if g.MaxChoices == 0 {
		g.MaxChoices = DefaultMaxChoices
	}
	for i := range spec.Models {
		m := &spec.Models[i]
		if m.ContextTokens == 0 {
			m.ContextTokens = DefaultContextTokens
		}
		for j := range m.Pools {
			if m.Pools[j].ServedModel == "" {
				m.Pools[j].ServedModel = m.Name
			}
		}
	}
}

// routingDefaults resolves the picker's settings: the older weight fields are folded into Weights (and
// cleared), and every scorer of the table has a weight.
func routingDefaults(r *Routing) {
	if r.MaxWaiting == 0 {
		r.MaxWaiting = DefaultMaxWaiting
	}
	if r.MaxKVUtilisation == 0 {
		r.MaxKVUtilisation = DefaultMaxKVUtilisation
	}
	if r.BoundedLoadEpsilon == 0 {
		r.BoundedLoadEpsilon = DefaultBoundedLoadEpsilon
	}
	if r.Placement == "" {
		r.Placement = PlacementSLO
	}
	if r.SLOMargin == 0 {
		r.SLOMargin = DefaultSLOMargin
	}
	weights := make(map[string]float64, len(scorers.Default))
	for name, w := range r.Weights {
		weights[name] = w
	}
	older := func(name string, w float64) {
		if _, set := weights[name]; !set {
			weights[name] = w
		}
	}
	if r.PrefixWeight != 0 || r.LoadWeight != 0 {
		older("prefix", r.PrefixWeight)
		older("load", r.LoadWeight)
	}
	if r.PrefillWeight != nil {
		older("prefill", *r.PrefillWeight)
	}
	if r.LoRAWeight != nil {
		older("lora", *r.LoRAWeight)
	}
	for _, s := range scorers.Default {
		older(s.Name, s.DefaultWeight)
	}
	r.Weights = weights
	r.PrefixWeight, r.LoadWeight, r.PrefillWeight, r.LoRAWeight = 0, 0, nil, nil
}
