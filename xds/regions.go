package xds

import (
	"slices"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// Regions in Envoy's resources (policies spec.regions, docs/regions.md). Every pool's endpoints are a locality
// of its region (Locality.Region; Zone is the pool). A pool's requests that Envoy cannot serve there (every
// replica ejected or unhealthy) fail over through an aggregate cluster, in priority order, to the model's pools
// in the regions after the pool's own in the gateway's region order (the xDS server's --region), nearest first,
// then to the managed API whose when lists unavailable. A pinned tenant's request carries
// contract.HeaderResidency and matches a route of its own whose aggregate holds only pools and a managed API
// inside the residency. Proxyless gRPC clients, which have no ext_proc, are weighted over the pools of the
// nearest region that has capacity.

// failoverChain is the clusters a pool's requests fail over to inside Envoy, in order: the model's pools that
// take whole requests under the pool's served name in the regions after the pool's own in the order of region (the gateway's), then the
// first fallback whose when lists unavailable; with within set (a residency), only those inside it.
func failoverChain(snap *policies.Snapshot, m *policies.Model, p *policies.Pool, region string, within []string) []string {
	inside := func(r string) bool { return within == nil || r != "" && slices.Contains(within, r) }
	var chain []string
	order := snap.RegionOrder(region)
	if at := slices.Index(order, p.Region); at >= 0 {
		for _, r := range order[at+1:] {
			if !inside(r) {
				continue
			}
			for j := range m.Pools {
				// The body was rewritten to the pool's served name: only a pool serving the same name can take it.
				if q := &m.Pools[j]; q.Region == r && q.ServesWhole() && q.ServedModel == p.ServedModel {
					chain = append(chain, contract.ClusterName(m.Name, q.Name))
				}
			}
		}
	}
	if f := failoverFallback(m); f != nil && inside(f.Region) {
		chain = append(chain, contract.FallbackClusterName(m.Name, f.Name))
	}
	return chain
}

// residentRoutes are the routes of pinned tenants' requests to a pool, one per residency of the policy that
// holds the pool's region, with the failover aggregates they need (added to out): they match the residency
// header as well as the pool, and go before the pool's own route.
func residentRoutes(snap *policies.Snapshot, m *policies.Model, p *policies.Pool, region string, out *Resources) []*routev3.Route {
	var routes []*routev3.Route
	for _, within := range snap.Residencies() {
		if !slices.Contains(within, p.Region) {
			continue
		}
		key := strings.Join(within, ",")
		target := contract.ClusterName(m.Name, p.Name)
		chain := failoverChain(snap, m, p, region, within)
		if len(chain) > 0 {
			target = contract.ResidentFailoverClusterName(m.Name, p.Name, key)
			out.Clusters = append(out.Clusters, failoverCluster(target, append([]string{contract.ClusterName(m.Name, p.Name)}, chain...)...))
		}
		match := headerMatch(contract.HeaderPool, p.Name)
		match.Headers = append(match.Headers, headerMatch(contract.HeaderResidency, key).Headers...)
		action := poolAction(m, chain, target, snap.UpstreamIdleTimeout())
		routes = append(routes, &routev3.Route{Name: contract.ResidentFailoverClusterName(m.Name, p.Name, key), Match: match,
			Action: &routev3.Route_Route{Route: action}})
	}
	return routes
}

// nearestCapacity keeps, of the pools' live capacities, those of the nearest region in the gateway's order that
// has any: proxyless clients go to another region only when theirs has no capacity left. Without a region
// order every pool keeps its capacity.
func nearestCapacity(snap *policies.Snapshot, m *policies.Model, region string, capacities map[string]float64) {
	order := snap.RegionOrder(region)
	if order == nil {
		return
	}
	byRegion := map[string]float64{}
	for j := range m.Pools {
		byRegion[m.Pools[j].Region] += capacities[contract.ClusterName(m.Name, m.Pools[j].Name)]
	}
	nearest := ""
	for _, r := range order {
		if byRegion[r] > 0 {
			nearest = r
			break
		}
	}
	for j := range m.Pools {
		if m.Pools[j].Region != nearest {
			delete(capacities, contract.ClusterName(m.Name, m.Pools[j].Name))
		}
	}
}

// crossRegion says whether a failover chain holds another region's pool: its route's retries then move to the
// next priority after retryPriorityEvery attempts in the pool (see withRetryPriority).
func crossRegion(m *policies.Model, chain []string) bool {
	for _, name := range chain {
		for j := range m.Pools {
			if contract.ClusterName(m.Name, m.Pools[j].Name) == name {
				return true
			}
		}
	}
	return false
}

// retryPriorityEvery is how many attempts a request makes in its pool before a retry goes to the next
// priority of its failover aggregate (the next region): the chosen replica and one other.
const retryPriorityEvery = 2

// withRetryPriority lets a route's retries leave a pool that fails as it is being lost, before Envoy has ejected
// its replicas: after retryPriorityEvery attempts, the priorities attempted (the aggregate's children) are
// excluded (envoy.retry_priorities.previous_priorities), so the last retry goes to the next region.
func withRetryPriority(a *routev3.RouteAction) *routev3.RouteAction {
	a.RetryPolicy.RetryPriority = &routev3.RetryPolicy_RetryPriority{Name: "envoy.retry_priorities.previous_priorities",
		ConfigType: &routev3.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: mustAny(
			&previousprioritiesv3.PreviousPrioritiesConfig{UpdateFrequency: retryPriorityEvery})}}
	return a
}
