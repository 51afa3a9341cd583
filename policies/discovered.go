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
	for _, m := range s.Policy.Spec.Models {
		for _, p := range m.Pools {
			if p.Service != nil && !slices.Contains(out, *p.Service) {
				out = append(out, *p.Service)
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
			for _, ep := range r.Endpoints(*p.Service) {
				ap, err := netip.ParseAddrPort(ep)
				if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() || seen[ap.String()] {
					continue
				}
				seen[ap.String()] = true
				p.Endpoints = append(p.Endpoints, ap.String())
			}
			slices.Sort(p.Endpoints)
			h.Write([]byte(m.Name + "/" + p.Name + "="))
			for _, ep := range p.Endpoints {
				h.Write([]byte(ep + ","))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:3])
}
