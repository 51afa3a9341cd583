// Package autoscaling holds the KEDA and HPA examples that scale a pool's engines on infergate's
// infergate_pool_desired_replicas; its tests decode them into their real API types.
package autoscaling
