// Package xds is infergate's control plane: it turns the policy and live fleet state into Envoy clusters,
// endpoints and routes. This file fixes the resource names that the ext_proc's headers, the shipped Envoy
// configuration and the generated resources must agree on (see the architecture document).
package xds

// RouteConfigName is the route configuration the listener's HTTP connection manager uses.
const RouteConfigName = "infergate"

// ClusterName is the Envoy cluster of one GPU pool.
func ClusterName(model, pool string) string { return "pool/" + model + "/" + pool }

// FallbackClusterName is the Envoy cluster of one managed-API fallback of a model.
func FallbackClusterName(model, fallback string) string { return "fallback/" + model + "/" + fallback }

// FailoverClusterName is the aggregate of a pool and its model's managed-API fallback that the pool's route
// uses when the model has a fallback for unavailable capacity.
func FailoverClusterName(model, pool string) string { return "failover/" + model + "/" + pool }

// ExtProcClusterName is the cluster through which Envoy reaches infergate's ext_proc server.
const ExtProcClusterName = "infergate-extproc"

// The gRPC metadata with which a fallback cluster's upstream ext_proc filter tells infergate which model and
// which of its fallbacks an attempt goes to (extproc reads the same names).
const (
	LegModelMetadata    = "x-infergate-leg-model"
	LegFallbackMetadata = "x-infergate-leg-fallback"
)
