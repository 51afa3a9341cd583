// Package contract is the agreement between infergate and Envoy, in one place: the headers and dynamic
// metadata the ext_proc answers carry, the names of the clusters, routes and secrets the xDS server builds
// and the routes match on, and the metadata of the fallback leg's upstream ext_proc. Every other package takes
// these names from here, so the two sides cannot drift apart. It imports nothing of the project.
package contract

import "strings"

// Request headers infergate sets (and strips when a client sends them).
const (
	// HeaderDestination lists the chosen endpoint and its retry alternatives, "ip:port[,ip:port...]", for
	// Envoy's override_host load-balancing policy (the Gateway API Inference Extension's name).
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderModel is the canonical model the request was routed as; routes match on it.
	HeaderModel = "x-infergate-model"
	// HeaderPool is the pool chosen, or FallbackPool(name) for a managed API; routes match on it.
	HeaderPool = "x-infergate-pool"
	// HeaderTenant names the tenant upstream, when the policy's gateway.tenantHeader asks for it.
	HeaderTenant = "x-infergate-tenant"
	// HeaderRequestID is the request's id, generated when the client sent none (or an unusable one).
	HeaderRequestID = "x-request-id"
	// HeaderScores carries every candidate's scores back to the client when routing.debugScores is on.
	HeaderScores = "x-infergate-scores"
	// HeaderRollout is a tester's choice of rollout arm ("candidate" or "baseline"), read from the client and
	// honoured only for the tenants a rollout names as testers; it is stripped like every reserved header.
	HeaderRollout = "x-infergate-rollout"
	// HeaderResidency names the regions a pinned tenant's request must stay in, "region[,region...]" sorted
	// (policies spec.regions): its pool's route then fails over only inside them.
	HeaderResidency = "x-infergate-residency"
)

// HeaderPrefiller names a split request's prefill endpoint (ip:port) to the decode pod's routing sidecar
// (llm-d's convention: the sidecar runs the prefill leg there and the decode leg on its own engine).
const HeaderPrefiller = "x-prefiller-host-port"

// MinimumEnvoy is the oldest Envoy release the shipped configurations and the served xDS resources work with:
// the override_host policy's selected_host_key (which reports the host Envoy used) first appeared in 1.38.
// deploy/envoy/minversion decodes every configuration with that release's API.
const MinimumEnvoy = "1.38"

// reservedPrefixes are the header families clients may never set: infergate strips them and sets its own.
var reservedPrefixes = [...]string{"x-gateway-", "x-infergate-"}

// disaggregationHeaders are llm-d's prefill/decode routing headers, which its routing sidecar in a decode pod
// obeys: from a client, x-prefiller-host-port would have the sidecar send the prompt to an address of the
// client's choosing. A gateway sets them; clients never do.
var disaggregationHeaders = [...]string{HeaderPrefiller, "x-prefiller-url", "x-encoder-hosts-ports",
	"x-data-parallel-host-port", "x-kv-cache-source-host-port"}

// Reserved reports whether a (lower-case) header name belongs to the contract, so a client-supplied one must be
// stripped.
func Reserved(name string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, h := range disaggregationHeaders {
		if name == h {
			return true
		}
	}
	return false
}

// Dynamic metadata.
const (
	// MetadataNamespace is where Envoy's override_host policy reads the destination (key HeaderDestination)
	// from the request's dynamic metadata and writes the endpoint it used (key ServedEndpointKey).
	MetadataNamespace = "envoy.lb"
	// ServedEndpointKey is the override_host policy's selected_host_key: the endpoint Envoy really sent the
	// request to, which a retry may have moved down the list.
	ServedEndpointKey = "x-gateway-destination-endpoint-served"
)

// Request attributes Envoy sends with the first request-path message (the ext_proc filter's
// request_attributes).
const (
	// AttributesKey is the filter's key in ProcessingRequest.attributes.
	AttributesKey = "envoy.filters.http.ext_proc"
	// SourceAddressAttribute is the client's address, for the per-source limit on failed authentications.
	SourceAddressAttribute = "source.address"
)

// The gRPC metadata an upstream ext_proc filter on a managed-API cluster sends (its grpc_service
// initial_metadata): which model and which of its fallbacks the attempt goes to.
const (
	LegModelMetadata    = "x-infergate-leg-model"
	LegFallbackMetadata = "x-infergate-leg-fallback"
)

// EdgeRegionMetadata is the gRPC metadata an Envoy's ext_proc filter sends (its grpc_service initial_metadata)
// to name the region the Envoy serves, when its ext_proc cluster can fail over to another region's infergate
// (docs/regions.md): that gateway then places the request as the Envoy's own region's gateway would.
const EdgeRegionMetadata = "x-infergate-edge-region"

const fallbackPoolPrefix = "fallback/"

// FallbackPool is the HeaderPool value for a managed API. Pool names cannot contain '/', so it never collides
// with a pool.
func FallbackPool(fallback string) string { return fallbackPoolPrefix + fallback }

// ParsePool reads a HeaderPool value: the managed API it names, or the pool.
func ParsePool(value string) (name string, fallback bool) {
	if f, ok := strings.CutPrefix(value, fallbackPoolPrefix); ok {
		return f, true
	}
	return value, false
}

// ClusterName is the Envoy cluster of a pool: "pool/<model>/<pool>".
func ClusterName(model, pool string) string { return "pool/" + model + "/" + pool }

// FallbackClusterName is the Envoy cluster of a model's managed API: "fallback/<model>/<fallback>". It also
// keys the in-flight count of requests sent there.
func FallbackClusterName(model, fallback string) string { return "fallback/" + model + "/" + fallback }

// FailoverClusterName is the aggregate of a pool and its model's managed API: "failover/<model>/<pool>".
func FailoverClusterName(model, pool string) string { return "failover/" + model + "/" + pool }

// ResidentFailoverClusterName is the aggregate a pinned tenant's requests to a pool fail over through: only
// pools and managed APIs inside the residency ("region[,region...]"): "failover/<model>/<pool>/<residency>".
func ResidentFailoverClusterName(model, pool, residency string) string {
	return FailoverClusterName(model, pool) + "/" + residency
}

// SecretName is the SDS generic secret holding a managed API's credential: "fallback-key/<model>/<fallback>".
func SecretName(model, fallback string) string { return "fallback-key/" + model + "/" + fallback }
