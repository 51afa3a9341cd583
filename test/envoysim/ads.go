package envoysim

import (
	"context"
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// ADSAddr is the control plane the bootstrap's ads_config names (its static cluster's first endpoint).
func (c *Config) ADSAddr() string {
	svcs := c.Bootstrap.GetDynamicResources().GetAdsConfig().GetGrpcServices()
	if len(svcs) == 0 {
		return ""
	}
	if cl, ok := c.Clusters[svcs[0].GetEnvoyGrpc().GetClusterName()]; ok && len(cl.Endpoints) > 0 {
		return cl.Endpoints[0]
	}
	return ""
}

// FetchADS takes the dynamic part of a bootstrap from its control plane over ADS, as Envoy does at startup:
// every cluster (CDS), the endpoints of the EDS ones, and the listener's route configuration (RDS). addr
// overrides the control plane's address ("" uses the bootstrap's). The data plane keeps this one snapshot;
// Envoy would follow updates, which the xDS tests cover.
func (c *Config) FetchADS(ctx context.Context, addr string) error {
	if c.RDSName == "" {
		return nil // static routes: nothing to fetch
	}
	if addr == "" {
		addr = c.ADSAddr()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("ads: %w", err)
	}
	defer conn.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("ads: %w", err)
	}
	node := proto.Clone(c.Bootstrap.GetNode()).(*corev3.Node)
	if node == nil {
		node = &corev3.Node{}
	}
	node.UserAgentName = "envoy"
	fetch := func(typeURL string, names ...string) ([]*anypb.Any, error) {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
			return nil, fmt.Errorf("ads %s: %w", typeURL, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("ads %s: %w", typeURL, err)
		}
		return resp.GetResources(), nil
	}

	anys, err := fetch(resource.ClusterType)
	if err != nil {
		return err
	}
	var clusters []*clusterv3.Cluster
	var eds []string
	for _, a := range anys {
		cl := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(cl); err != nil {
			return fmt.Errorf("ads cluster: %w", err)
		}
		clusters = append(clusters, cl)
		if cl.GetType() == clusterv3.Cluster_EDS {
			eds = append(eds, cl.GetName())
		}
	}
	cla := map[string]*endpointv3.ClusterLoadAssignment{}
	if len(eds) > 0 {
		anys, err := fetch(resource.EndpointType, eds...)
		if err != nil {
			return err
		}
		for _, a := range anys {
			l := &endpointv3.ClusterLoadAssignment{}
			if err := a.UnmarshalTo(l); err != nil {
				return fmt.Errorf("ads endpoints: %w", err)
			}
			cla[l.GetClusterName()] = l
		}
	}
	for _, cl := range clusters {
		if l, ok := cla[cl.GetName()]; ok {
			cl.LoadAssignment = l
		}
		built, err := buildCluster(cl)
		if err != nil {
			return err
		}
		if _, static := c.Clusters[cl.GetName()]; !static {
			c.Clusters[cl.GetName()] = built
		}
	}
	if names := secretNames(c.Clusters); len(names) > 0 {
		anys, err := fetch(resource.SecretType, names...)
		if err != nil {
			return err
		}
		if c.Secrets == nil {
			c.Secrets = map[string]string{}
		}
		for _, a := range anys {
			sec := &tlsv3.Secret{}
			if err := a.UnmarshalTo(sec); err != nil {
				return fmt.Errorf("ads secret: %w", err)
			}
			c.Secrets[sec.GetName()] = sec.GetGenericSecret().GetSecret().GetInlineString()
		}
	}
	anys, err = fetch(resource.RouteType, c.RDSName)
	if err != nil {
		return err
	}
	if len(anys) != 1 {
		return fmt.Errorf("ads: route configuration %q not served", c.RDSName)
	}
	rc := &routev3.RouteConfiguration{}
	if err := anys[0].UnmarshalTo(rc); err != nil {
		return fmt.Errorf("ads route configuration: %w", err)
	}
	c.Routes = rc
	return nil
}
