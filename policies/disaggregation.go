package policies

import (
	"net/netip"
	"slices"
)

// Disaggregation is how a model's requests may be split between a prefill replica and a decode replica.
type Disaggregation struct {
	// Protocol is how the decode replica learns its prefiller: llm-d (the request goes to the decode pod's
	// routing sidecar with x-prefiller-host-port; the sidecar's --kv-connector runs the legs: nixlv2 for vLLM's
	// NIXL connector, sglang for SGLang's bootstrap fields).
	Protocol string `yaml:"protocol" json:"protocol" jsonschema:"enum=llm-d"`
	// MinUncachedTokens is the least prompt a request must leave to prefill (after its cached prefix) for it to
	// be split; shorter ones run whole on one replica (default 1024).
	MinUncachedTokens int `yaml:"minUncachedTokens,omitempty" json:"minUncachedTokens,omitempty" jsonschema:"minimum=0"`
	// Split is how a request past MinUncachedTokens is decided: pays (default) splits it only when splitting
	// pays — sooner, or within the request's targets at a lower prefill cost, or sparing the decoder's batch its
	// TPOT target; threshold splits every one that a prefiller can take (llm-d's prefix-based decider; what
	// decode servers that take only split requests need).
	Split string `yaml:"split,omitempty" json:"split,omitempty" jsonschema:"enum=pays,enum=threshold"`
	// KVBytesPerToken is the model's KV cache per token (layers × KV heads × head size × 2 × bytes a value,
	// e.g. 163840 for Llama-3.3-70B in FP8): with TransferGbps, what moving a prompt's cache costs.
	KVBytesPerToken int64 `yaml:"kvBytesPerToken" json:"kvBytesPerToken" jsonschema:"minimum=1"`
	// TransferGbps is the link between prefill and decode replicas, in gigabits a second (default 100: one
	// 100 Gb/s RDMA NIC).
	TransferGbps float64 `yaml:"transferGbps,omitempty" json:"transferGbps,omitempty" jsonschema:"minimum=0"`
}

// Disaggregation defaults.
const (
	ProtocolLLMD                   = "llm-d"
	DefaultDisaggMinUncachedTokens = 1024
	DefaultDisaggTransferGbps      = 100
	SplitWhenItPays                = "pays"
	SplitPastThreshold             = "threshold"
)

// disaggregation validates a model's pool roles against its disaggregation.
func (v *validator) disaggregation(m *Model, base []seg) {
	split := false
	prefill, decode := false, false
	for j := range m.Pools {
		p := &m.Pools[j]
		switch p.Role {
		case "", RoleBoth:
		case RolePrefill, RoleDecode:
			split = true
		default:
			v.fail(append(slices.Clone(base), "pools", j, "role"), "must be both, prefill or decode, got %q", p.Role)
		}
		prefill = prefill || p.Prefills()
		decode = decode || p.ServesWhole()
	}
	v.engineEndpoints(m, base)
	d := m.Disaggregation
	if d == nil {
		if split {
			v.fail(append(slices.Clone(base), "pools"), "pools with a prefill or decode role need spec.models[].disaggregation")
		}
		return
	}
	db := append(slices.Clone(base), "disaggregation")
	if d.Protocol != ProtocolLLMD {
		v.fail(append(slices.Clone(db), "protocol"), "must be %q (the decode pod's routing sidecar), got %q", ProtocolLLMD, d.Protocol)
	}
	if d.KVBytesPerToken <= 0 {
		v.fail(append(slices.Clone(db), "kvBytesPerToken"), "must be above 0: the model's KV cache bytes per token")
	}
	if d.Split != "" && d.Split != SplitWhenItPays && d.Split != SplitPastThreshold {
		v.fail(append(slices.Clone(db), "split"), "must be %q or %q, got %q", SplitWhenItPays, SplitPastThreshold, d.Split)
	}
	if d.MinUncachedTokens < 0 || d.TransferGbps < 0 {
		v.fail(db, "minUncachedTokens and transferGbps must not be negative")
	}
	if !prefill || !decode {
		v.fail(append(slices.Clone(base), "pools"), "a disaggregated model needs a pool that prefills (role prefill or both) and one that decodes (decode or both)")
	}
}

// engineEndpoints validates the engines behind decode replicas' sidecars (Pool.EngineEndpoints): one ip:port
// for each endpoint of a pool that decodes for a disaggregated model, none of them a replica's own address.
func (v *validator) engineEndpoints(m *Model, base []seg) {
	taken := map[string]bool{}
	for j := range m.Pools {
		for _, ep := range m.Pools[j].Endpoints {
			taken[ep] = true
		}
	}
	for j := range m.Pools {
		p := &m.Pools[j]
		if p.Service != nil && p.Service.EnginePort != "" && (m.Disaggregation == nil || !p.ServesWhole()) {
			v.fail(append(slices.Clone(base), "pools", j, "service", "enginePort"),
				"only a pool that decodes (role decode or both) for a model with disaggregation has engines behind sidecars")
		}
		if len(p.EngineEndpoints) == 0 {
			continue
		}
		pb := append(slices.Clone(base), "pools", j, "engineEndpoints")
		switch {
		case m.Disaggregation == nil || !p.ServesWhole():
			v.fail(pb, "only a pool that decodes (role decode or both) for a model with disaggregation has engines behind sidecars")
			continue
		case p.Service != nil:
			v.fail(pb, "a pool discovered from a Service names its engines' port instead (service.enginePort)")
			continue
		case len(p.EngineEndpoints) != len(p.Endpoints):
			v.fail(pb, "must list one engine for each of the pool's %d endpoints, in their order, got %d", len(p.Endpoints), len(p.EngineEndpoints))
			continue
		}
		for k, ep := range p.EngineEndpoints {
			ap, err := netip.ParseAddrPort(ep)
			switch {
			case err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified():
				v.fail(append(slices.Clone(pb), k), "%q is not an ip:port address", ep)
			case ap.String() != ep:
				v.fail(append(slices.Clone(pb), k), "write %q as %q", ep, ap.String())
			case taken[ep]:
				v.fail(append(slices.Clone(pb), k), "%s is a replica's address (or listed twice): the engine is reached on a port of its own", ep)
			default:
				taken[ep] = true
			}
		}
	}
}
