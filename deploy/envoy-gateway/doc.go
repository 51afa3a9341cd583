// Package envoygateway holds no code: its tests check the Envoy Gateway manifests in this folder against Envoy
// Gateway's and the Gateway API's own types and against infergate's policy and Kubernetes manifests.
package envoygateway
