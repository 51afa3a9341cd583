package envoysim

import (
	"math/rand/v2"
	"net"
	"strings"
	"sync"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// routeFor matches the request against the route configuration, as Envoy's router does at decodeHeaders
// (and again only after the route cache is cleared).
func routeFor(rc *routev3.RouteConfiguration, h *headerMap) *routev3.Route {
	host := h.value(":authority")
	if i := strings.LastIndexByte(host, ':'); i > 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	vh := matchVirtualHost(rc.GetVirtualHosts(), host)
	if vh == nil {
		return nil
	}
	path := h.value(":path")
	pathOnly := path
	if i := strings.IndexByte(path, '?'); i >= 0 {
		pathOnly = path[:i]
	}
	for _, r := range vh.GetRoutes() {
		m := r.GetMatch()
		switch ps := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			if !strings.HasPrefix(pathOnly, ps.Prefix) {
				continue
			}
		case *routev3.RouteMatch_Path:
			if pathOnly != ps.Path {
				continue
			}
		case *routev3.RouteMatch_SafeRegex:
			if !compiledRegex(ps.SafeRegex.GetRegex()).MatchString(pathOnly) {
				continue
			}
		}
		if headersMatch(m.GetHeaders(), h) {
			return r
		}
	}
	return nil
}

func matchVirtualHost(vhs []*routev3.VirtualHost, host string) *routev3.VirtualHost {
	var wildcard *routev3.VirtualHost
	for _, vh := range vhs {
		for _, d := range vh.GetDomains() {
			switch {
			case d == "*":
				if wildcard == nil {
					wildcard = vh
				}
			case strings.EqualFold(d, host):
				return vh
			case strings.HasPrefix(d, "*") && strings.HasSuffix(host, d[1:]):
				return vh
			case strings.HasSuffix(d, "*") && strings.HasPrefix(host, d[:len(d)-1]):
				return vh
			}
		}
	}
	return wildcard
}

func headersMatch(ms []*routev3.HeaderMatcher, h *headerMap) bool {
	for _, m := range ms {
		v, present := h.get(m.GetName())
		var ok bool
		switch spec := m.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_StringMatch:
			ok = present && stringMatch(spec.StringMatch, v)
		case *routev3.HeaderMatcher_PresentMatch:
			ok = present == spec.PresentMatch
		case *routev3.HeaderMatcher_ExactMatch:
			//lint:ignore SA1019 deprecated but still accepted by Envoy in route configs
			ok = present && v == spec.ExactMatch
		case *routev3.HeaderMatcher_PrefixMatch:
			//lint:ignore SA1019 deprecated but still accepted by Envoy in route configs
			ok = present && strings.HasPrefix(v, spec.PrefixMatch)
		case nil:
			ok = present
		}
		if m.GetInvertMatch() {
			ok = !ok
		}
		if !ok {
			return false
		}
	}
	return true
}

// pickCluster resolves a route action to a cluster name (weighted clusters pick by weight).
func pickCluster(ra *routev3.RouteAction, h *headerMap) string {
	switch cs := ra.GetClusterSpecifier().(type) {
	case *routev3.RouteAction_Cluster:
		return cs.Cluster
	case *routev3.RouteAction_ClusterHeader:
		return h.value(cs.ClusterHeader)
	case *routev3.RouteAction_WeightedClusters:
		total := 0
		for _, c := range cs.WeightedClusters.GetClusters() {
			total += int(c.GetWeight().GetValue())
		}
		if total == 0 {
			return ""
		}
		n := rand.IntN(total)
		for _, c := range cs.WeightedClusters.GetClusters() {
			n -= int(c.GetWeight().GetValue())
			if n < 0 {
				return c.GetName()
			}
		}
	}
	return ""
}

// hostPicker chooses upstream hosts in a cluster: the override_host list first (members only, in order),
// then the fallback policy (least request).
type hostPicker struct {
	mu     sync.Mutex
	active map[string]int
}

// overrideList reads the override hosts from the configured sources, header first if listed first.
func overrideList(c *Cluster, h *headerMap, md func(ns string) *structpb.Struct) []string {
	if c.OverrideHost == nil {
		return nil
	}
	for _, src := range c.OverrideHost.GetOverrideHostSources() {
		var v string
		if name := src.GetHeader(); name != "" {
			v = h.value(strings.ToLower(name))
		} else if mk := src.GetMetadata(); mk != nil {
			s := md(mk.GetKey())
			for _, seg := range mk.GetPath() {
				if s == nil {
					break
				}
				val := s.GetFields()[seg.GetKey()]
				if sv := val.GetStructValue(); sv != nil {
					s = sv
					continue
				}
				v = val.GetStringValue()
				break
			}
		}
		if v == "" {
			continue
		}
		var out []string
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
		return out
	}
	return nil
}

// next returns the next host to try, skipping tried ones: listed hosts that belong to the cluster, in order,
// then the least-loaded endpoint.
func (p *hostPicker) next(dp *DataPlane, c *Cluster, listed []string, tried map[string]bool) string {
	for _, a := range listed {
		if !tried[a] && member(c, a) && dp.available(c, a) {
			return a
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	best, bestLoad, panicPick := "", 0, ""
	start := rand.IntN(max(1, len(c.Endpoints)))
	for i := range c.Endpoints {
		ep := c.Endpoints[(start+i)%len(c.Endpoints)]
		if tried[ep] {
			continue
		}
		if !dp.available(c, ep) {
			if panicPick == "" {
				panicPick = ep
			}
			continue
		}
		if best == "" || p.active[ep] < bestLoad {
			best, bestLoad = ep, p.active[ep]
		}
	}
	if best == "" {
		return panicPick // no available host: Envoy's panic mode uses them all
	}
	return best
}

func member(c *Cluster, addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	for _, ep := range c.Endpoints {
		if eh, epp, _ := net.SplitHostPort(ep); eh == host && epp == port {
			return true
		}
	}
	return false
}

func (p *hostPicker) start(ep string) {
	p.mu.Lock()
	p.active[ep]++
	p.mu.Unlock()
}

func (p *hostPicker) done(ep string) {
	p.mu.Lock()
	p.active[ep]--
	p.mu.Unlock()
}
