// Package xds is infergate's control plane: it turns the policy and live fleet state into Envoy clusters,
// endpoints and routes, named as package contract says.
package xds

// RouteConfigName is the route configuration the listener's HTTP connection manager uses.
const RouteConfigName = "infergate"

// ExtProcClusterName is the cluster through which Envoy reaches infergate's ext_proc server.
const ExtProcClusterName = "infergate-extproc"
