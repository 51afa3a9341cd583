package policies

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
)

// EndpointResolver gives the current endpoints of a pool that names a Kubernetes Service (discovery.Watcher):
// ready, not terminating, as ip:port.
type EndpointResolver interface {
	Endpoints(ref ServiceRef) []string
}

// HasServices says whether any pool of the policy is discovered from a Service.
func (s *Snapshot) HasServices() bool { return len(s.Services()) > 0 }

// Services lists the Services the policy's pools are discovered from, each once.
func (s *Snapshot) Services() []ServiceRef {
	var out []ServiceRef
	add := func(ref ServiceRef) {
		if !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	for _, m := range s.Policy.Spec.Models {
		for _, p := range m.Pools {
			if p.Service == nil {
				continue
			}
			add(p.Service.watched(p.Service.Port))
			if p.Service.EnginePort != "" {
				add(p.Service.watched(p.Service.EnginePort))
			}
		}
	}
	return out
}

// resolve fills every discovered pool's endpoints from r (none without one) and returns a digest of what it
// filled, so that a snapshot's version changes with its endpoints. Addresses that are not a usable ip:port,
// or that another pool of the model already has, are left out.
func resolve(pol *Policy, r EndpointResolver) string {
	h := sha256.New()
	for i := range pol.Spec.Models {
		m := &pol.Spec.Models[i]
		seen := map[string]bool{}
		for j := range m.Pools {
			for _, ep := range m.Pools[j].Endpoints {
				seen[ep] = true
			}
		}
		for j := range m.Pools {
			p := &m.Pools[j]
			if p.Service == nil {
				continue
			}
			p.Endpoints = nil
			if r == nil {
				continue
			}
			for _, ep := range r.Endpoints(p.Service.watched(p.Service.Port)) {
				ap, err := netip.ParseAddrPort(ep)
				if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() || seen[ap.String()] {
					continue
				}
				seen[ap.String()] = true
				p.Endpoints = append(p.Endpoints, ap.String())
			}
			slices.Sort(p.Endpoints)
			p.EngineEndpoints = enginesOf(p, r, seen)
			h.Write([]byte(m.Name + "/" + p.Name + "="))
			for i, ep := range p.Endpoints {
				h.Write([]byte(ep + ","))
				if p.EngineEndpoints != nil {
					h.Write([]byte(p.EngineEndpoints[i] + ","))
				}
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:3])
}

// enginesOf pairs a discovered pool's endpoints with their engines past the sidecar (service.enginePort), by
// address: "" for a replica whose slice lists no engine port, or whose engine address another replica has.
func enginesOf(p *Pool, r EndpointResolver, seen map[string]bool) []string {
	if p.Service.EnginePort == "" || len(p.Endpoints) == 0 {
		return nil
	}
	byAddr := map[netip.Addr]string{}
	for _, ep := range r.Endpoints(p.Service.watched(p.Service.EnginePort)) {
		if ap, err := netip.ParseAddrPort(ep); err == nil && ap.Port() != 0 && !seen[ap.String()] {
			byAddr[ap.Addr()] = ap.String()
		}
	}
	out := make([]string, len(p.Endpoints))
	for i, ep := range p.Endpoints {
		ap, _ := netip.ParseAddrPort(ep)
		if engine, ok := byAddr[ap.Addr()]; ok {
			out[i] = engine
			seen[engine] = true
			delete(byAddr, ap.Addr())
		}
	}
	return out
}
