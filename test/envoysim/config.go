// Package envoysim is a test data plane that behaves as Envoy does as an ext_proc client, for machines where
// no Envoy binary can run. It reads the Envoy bootstrap we ship (deploy/envoy/*.yaml) with go-control-plane's
// types, serves HTTP/1.1, drives one ext_proc stream per request following docs/architecture.md (E1-E10)
// (processing modes, mutation rules, route cache, dynamic metadata, timeouts, failure modes), routes on headers
// to clusters whose override_host policy reads x-gateway-destination-endpoint, and proxies to the replica.
// It is a development and test tool, never a production path.
package envoysim

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // Any type in the bootstrap
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"
)

// Config is what the data plane takes from an Envoy bootstrap.
type Config struct {
	Bootstrap   *bootstrapv3.Bootstrap
	ListenAddr  string
	BufferLimit int // per_connection_buffer_limit_bytes (Envoy's default 1 MiB)
	// RequestTimeout is the HCM's request_timeout: how long the whole request may take to arrive (0: none,
	// Envoy's default).
	RequestTimeout time.Duration
	ExtProc        *extprocfilterv3.ExternalProcessor
	// ExtProcAddr is the processor's address, from the cluster its grpc_service names.
	ExtProcAddr string
	Routes      *routev3.RouteConfiguration
	Clusters    map[string]*Cluster
	// RDSName is the route configuration the listener takes over ADS when the bootstrap has dynamic
	// resources; FetchADS fills Routes and the dynamic clusters.
	RDSName string
	// Secrets are SDS generic secrets by name (their inline value), which FetchADS takes for the credential
	// injectors of the clusters.
	Secrets map[string]string
}

// Cluster is an upstream cluster with static endpoints.
type Cluster struct {
	Name      string
	Endpoints []string
	// Priorities are the endpoints' locality priorities, in the same order.
	Priorities     []int
	ConnectTimeout time.Duration
	OverrideHost   *overridehostv3.OverrideHost // nil: plain round robin / least request
	// Children are an aggregate cluster's clusters, in priority order (upstream.go).
	Children []string
	// Unhealthy are endpoints EDS marks other than healthy, degraded or unknown.
	Unhealthy map[string]bool
	Outlier   *clusterv3.OutlierDetection
	// UpstreamFilters are the cluster's upstream HTTP filters the data plane runs per attempt (upstream.go).
	UpstreamFilters []UpstreamFilter
	// HealthCheck is the cluster's active HTTP health check, or nil (health.go).
	HealthCheck *HealthCheck
	// TLS is the cluster's upstream TLS (tls.go), nil for plaintext.
	TLS *tls.Config
}

func joinHostPort(host string, port uint32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// LoadFile reads an Envoy bootstrap in YAML.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read envoy config: %w", err)
	}
	return Parse(data)
}

// ParseBootstrap decodes Envoy bootstrap YAML into go-control-plane's Bootstrap, rejecting unknown fields.
func ParseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("envoy config YAML: %w", err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("envoy config to JSON: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		return nil, fmt.Errorf("envoy config: %w", err)
	}
	return &bs, nil
}

// Parse builds a Config from bootstrap YAML: the first listener's HCM, its ext_proc filter and route
// configuration, and every static cluster.
func Parse(data []byte) (*Config, error) {
	bs, err := ParseBootstrap(data)
	if err != nil {
		return nil, err
	}
	if err := bs.ValidateAll(); err != nil {
		return nil, fmt.Errorf("envoy config fails validation: %w", err)
	}
	sr := bs.GetStaticResources()
	if len(sr.GetListeners()) == 0 {
		return nil, fmt.Errorf("envoy config has no static listener")
	}
	lis := sr.GetListeners()[0]
	sa := lis.GetAddress().GetSocketAddress()
	cfg := &Config{
		Bootstrap:   bs,
		ListenAddr:  net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))),
		BufferLimit: 1 << 20,
		Clusters:    map[string]*Cluster{},
	}
	if l := lis.GetPerConnectionBufferLimitBytes(); l != nil {
		cfg.BufferLimit = int(l.GetValue())
	}
	var hcm hcmv3.HttpConnectionManager
	found := false
	for _, fc := range lis.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetTypedConfig().MessageIs(&hcm) {
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					return nil, fmt.Errorf("http_connection_manager: %w", err)
				}
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("listener %s has no http_connection_manager", lis.GetName())
	}
	cfg.Routes = hcm.GetRouteConfig()
	cfg.RequestTimeout = hcm.GetRequestTimeout().AsDuration()
	if cfg.Routes == nil {
		if hcm.GetRds().GetConfigSource().GetAds() == nil || bs.GetDynamicResources().GetAdsConfig() == nil {
			return nil, fmt.Errorf("the data plane needs an inline route_config or RDS over ADS")
		}
		cfg.RDSName = hcm.GetRds().GetRouteConfigName()
	}
	for _, hf := range hcm.GetHttpFilters() {
		ep := &extprocfilterv3.ExternalProcessor{}
		if hf.GetTypedConfig().MessageIs(ep) {
			if err := hf.GetTypedConfig().UnmarshalTo(ep); err != nil {
				return nil, fmt.Errorf("ext_proc filter: %w", err)
			}
			cfg.ExtProc = ep
		}
	}
	for _, c := range sr.GetClusters() {
		cl, err := buildCluster(c)
		if err != nil {
			return nil, err
		}
		cfg.Clusters[c.GetName()] = cl
	}
	if cfg.ExtProc != nil {
		name := cfg.ExtProc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		if c, ok := cfg.Clusters[name]; ok && len(c.Endpoints) > 0 {
			cfg.ExtProcAddr = c.Endpoints[0]
		} else if uri := cfg.ExtProc.GetGrpcService().GetGoogleGrpc().GetTargetUri(); uri != "" {
			cfg.ExtProcAddr = uri
		} else {
			return nil, fmt.Errorf("ext_proc grpc_service cluster %q not found", name)
		}
	}
	return cfg, nil
}

func buildCluster(c *clusterv3.Cluster) (*Cluster, error) {
	cl := &Cluster{Name: c.GetName(), ConnectTimeout: 5 * time.Second}
	if d := c.GetConnectTimeout(); d != nil {
		cl.ConnectTimeout = d.AsDuration()
	}
	for _, lle := range c.GetLoadAssignment().GetEndpoints() {
		for _, lbe := range lle.GetLbEndpoints() {
			sa := lbe.GetEndpoint().GetAddress().GetSocketAddress()
			cl.Endpoints = append(cl.Endpoints, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
			cl.Priorities = append(cl.Priorities, int(lle.GetPriority()))
		}
	}
	if err := parseUpstream(cl, c); err != nil {
		return nil, err
	}
	tlsCfg, err := upstreamTLS(c)
	if err != nil {
		return nil, err
	}
	cl.TLS = tlsCfg
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		oh := &overridehostv3.OverrideHost{}
		if p.GetTypedExtensionConfig().GetTypedConfig().MessageIs(oh) {
			if err := p.GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(oh); err != nil {
				return nil, fmt.Errorf("cluster %s override_host: %w", c.GetName(), err)
			}
			cl.OverrideHost = oh
		}
	}
	return cl, nil
}
