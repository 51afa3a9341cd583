package policies

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// Region is a place the fleet runs in: a cloud region or an on-prem site, with what it takes to reach the
// others from it.
type Region struct {
	// Name is the region's name, as pools, fallbacks, residency and infergate serve --region give it.
	Name string `yaml:"name" json:"name" jsonschema:"minLength=1"`
	// RTT is the round trip from this region's gateways to another region's pools, by region name, e.g.
	// {eu-west: "80ms"}; one side of a pair is enough. SLO placement adds it to a remote pool's predicted time
	// to first token. A pair neither side states counts DefaultRegionRTT.
	RTT map[string]string `yaml:"rtt,omitempty" json:"rtt,omitempty"`
	// Failover orders the regions this region's gateways send to when its own pools cannot take a request
	// (down, saturated, or under SLO placement predicted late); a region left out is never used from here
	// (default: every other, nearest first).
	Failover []string `yaml:"failover,omitempty" json:"failover,omitempty"`
}

// Region defaults.
const (
	// DefaultRegionRTT is the round trip assumed between two regions whose RTT the policy does not state:
	// that of two distant cloud regions, so that an unstated pair never looks nearer than it is.
	DefaultRegionRTT = 100 * time.Millisecond
	// DefaultRegionFailback is how long a region that was down must stay up before it is preferred again.
	DefaultRegionFailback = 10 * time.Second
	// MaxRegions bounds the regions of a policy (the picker counts them on the stack).
	MaxRegions = 16
	// maxRegionRTT bounds a stated RTT: beyond it the figure is a mistake, not a network.
	maxRegionRTT = 10 * time.Second
)

// regionTable is spec.regions compiled for the picker: each region's failover order and the RTT of each pair.
type regionTable struct {
	order    map[string][]string // a region, then its failover regions in order
	rtt      map[[2]string]time.Duration
	failback time.Duration
}

// compileRegions resolves the regions' RTTs (one side of a pair stands for both) and failover orders (by
// default every other region, nearest first, then in the policy's order).
func (s *Snapshot) compileRegions(pol *Policy) {
	t := regionTable{order: map[string][]string{}, rtt: map[[2]string]time.Duration{}, failback: DefaultRegionFailback}
	if d, err := time.ParseDuration(pol.Spec.Routing.RegionFailback); err == nil && d > 0 {
		t.failback = d
	}
	regions := pol.Spec.Regions
	for _, r := range regions {
		for to, v := range r.RTT {
			if d, err := time.ParseDuration(v); err == nil {
				t.rtt[[2]string{r.Name, to}] = d
				if _, stated := t.rtt[[2]string{to, r.Name}]; !stated {
					t.rtt[[2]string{to, r.Name}] = d
				}
			}
		}
	}
	for _, r := range regions {
		for _, o := range regions {
			if _, ok := t.rtt[[2]string{r.Name, o.Name}]; !ok && o.Name != r.Name {
				t.rtt[[2]string{r.Name, o.Name}] = DefaultRegionRTT
			}
		}
	}
	for i, r := range regions {
		order := []string{r.Name}
		if len(r.Failover) > 0 {
			order = append(order, r.Failover...)
		} else {
			others := make([]int, 0, len(regions)-1)
			for j := range regions {
				if j != i {
					others = append(others, j)
				}
			}
			slices.SortStableFunc(others, func(a, b int) int {
				return cmp.Compare(t.rtt[[2]string{r.Name, regions[a].Name}], t.rtt[[2]string{r.Name, regions[b].Name}])
			})
			for _, j := range others {
				order = append(order, regions[j].Name)
			}
		}
		t.order[r.Name] = order
	}
	s.regions = t
}

// Regional says whether the policy places its pools in regions.
func (s *Snapshot) Regional() bool { return len(s.regions.order) > 0 }

// RegionOrder is the order a gateway in region local takes regions in: its own, then its failover regions;
// nil when the policy has no regions or does not know local (every region then ranks alike).
func (s *Snapshot) RegionOrder(local string) []string { return s.regions.order[local] }

// RegionRTT is the round trip from a gateway in region from to a pool in region to (0 within one region, or
// when either is not a region of the policy).
func (s *Snapshot) RegionRTT(from, to string) time.Duration {
	if from == to {
		return 0
	}
	return s.regions.rtt[[2]string{from, to}]
}

// RegionFailback is how long a region that was down must stay up before requests prefer it again.
func (s *Snapshot) RegionFailback() time.Duration { return s.regions.failback }

// ResidencyKey is a pinned tenant's residency as one string, "region[,region...]" (contract.HeaderResidency);
// "" when it is not pinned.
func (s *Snapshot) ResidencyKey(t *Tenant) string { return s.residencyKey[t] }

// Residencies are the distinct residencies of the policy's tenants, each sorted, in the order of their keys:
// the xDS routes that keep a pinned tenant's failover inside its residency.
func (s *Snapshot) Residencies() [][]string {
	seen := map[string][]string{}
	for t, r := range s.residency {
		seen[s.residencyKey[t]] = r
	}
	out := make([][]string, 0, len(seen))
	for _, k := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, seen[k])
	}
	return out
}

// Residency is the regions a tenant's requests must stay in, sorted; nil when it is not pinned.
func (s *Snapshot) Residency(t *Tenant) []string {
	if t == nil {
		return nil
	}
	return s.residency[t]
}

// Resident says whether a tenant's requests may be served in a region: always when it is not pinned, otherwise
// only in one of its residency's regions ("" — a fallback outside every region — is in none).
func (s *Snapshot) Resident(t *Tenant, region string) bool {
	r := s.Residency(t)
	return r == nil || region != "" && slices.Contains(r, region)
}

// FallbackAllowed says whether a tenant's overflow may go to a managed fallback: only to one in its residency.
func (s *Snapshot) FallbackAllowed(t *Tenant, f *Fallback) bool { return s.Resident(t, f.Region) }

// compileResidency resolves a tenant's residency: its own and its tier's, intersected when both are set.
func (s *Snapshot) compileResidency(pol *Policy, t *Tenant) {
	var sets [][]string
	if len(t.Residency) > 0 {
		sets = append(sets, t.Residency)
	}
	if tier, ok := pol.Spec.Tiers[t.Tier]; ok && len(tier.Residency) > 0 {
		sets = append(sets, tier.Residency)
	}
	if len(sets) == 0 {
		return
	}
	in := map[string]int{}
	for _, set := range sets {
		for _, r := range slices.Compact(slices.Sorted(slices.Values(set))) {
			in[r]++
		}
	}
	kept := []string{} // not nil: a tenant pinned to no region at all is served nowhere
	for _, r := range slices.Sorted(maps.Keys(in)) {
		if in[r] == len(sets) {
			kept = append(kept, r)
		}
	}
	s.residency[t], s.residencyKey[t] = kept, strings.Join(kept, ",")
}

// regions validates spec.regions and every field that names a region.
func (v *validator) regions(s *Spec) {
	if len(s.Regions) > MaxRegions {
		v.fail(p("spec", "regions"), "at most %d regions, got %d", MaxRegions, len(s.Regions))
	}
	names := map[string]bool{}
	for i, r := range s.Regions {
		switch {
		case r.Name == "":
			v.fail(p("spec", "regions", i, "name"), "a region needs a name")
		case names[r.Name]:
			v.fail(p("spec", "regions", i, "name"), "region %q is named twice", r.Name)
		}
		names[r.Name] = true
	}
	known := func(path []seg, name string) {
		switch {
		case len(s.Regions) == 0:
			v.fail(path, "names region %q, but spec.regions lists none", name)
		case !names[name]:
			v.fail(path, "unknown region %q", name)
		}
	}
	for i, r := range s.Regions {
		v.regionLinks(i, r, names, known)
	}
	if s.Routing.RegionFailback != "" {
		if d, err := time.ParseDuration(s.Routing.RegionFailback); err != nil || d < 0 {
			v.fail(p("spec", "routing", "regionFailback"), "must be a duration such as \"10s\", got %q", s.Routing.RegionFailback)
		}
	}
	for i := range s.Models {
		for j, pool := range s.Models[i].Pools {
			switch {
			case pool.Region != "":
				known(p("spec", "models", i, "pools", j, "region"), pool.Region)
			case len(s.Regions) > 0:
				v.fail(p("spec", "models", i, "pools", j), "pool %q needs a region: the policy has regions", pool.Name)
			}
		}
		for j, f := range s.Models[i].Fallbacks {
			if f.Region != "" {
				known(p("spec", "models", i, "fallbacks", j, "region"), f.Region)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.Tiers)) {
		for j, r := range s.Tiers[name].Residency {
			known(p("spec", "tiers", name, "residency", j), r)
		}
	}
	for i, t := range s.Tenants {
		for j, r := range t.Residency {
			known(p("spec", "tenants", i, "residency", j), r)
		}
		if tier, ok := s.Tiers[t.Tier]; ok && len(t.Residency) > 0 && len(tier.Residency) > 0 &&
			!slices.ContainsFunc(t.Residency, func(r string) bool { return slices.Contains(tier.Residency, r) }) {
			v.fail(p("spec", "tenants", i, "residency"), "shares no region with tier %q's residency %v: the tenant could be served nowhere", t.Tier, tier.Residency)
		}
	}
}

// regionLinks validates one region's RTTs and failover order.
func (v *validator) regionLinks(i int, r Region, names map[string]bool, known func([]seg, string)) {
	for _, to := range slices.Sorted(maps.Keys(r.RTT)) {
		at := p("spec", "regions", i, "rtt", to)
		if to == r.Name {
			v.fail(at, "a region's RTT to itself is not stated")
			continue
		}
		known(at, to)
		if d, err := time.ParseDuration(r.RTT[to]); err != nil || d < 0 || d > maxRegionRTT {
			v.fail(at, "must be a duration from 0 to %v such as \"40ms\", got %q", maxRegionRTT, r.RTT[to])
		}
	}
	seen := map[string]bool{}
	for j, f := range r.Failover {
		at := p("spec", "regions", i, "failover", j)
		switch {
		case f == r.Name:
			v.fail(at, "a region does not fail over to itself")
		case seen[f]:
			v.fail(at, "region %q is listed twice", f)
		default:
			known(at, f)
		}
		seen[f] = true
	}
}
