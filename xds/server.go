package xds

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/policies"
)

// Snapshot keys: every Envoy allowed the managed-API keys gets the same resources, every other Envoy the same
// without secrets, and every proxyless grpc-go client its own kind.
const (
	nodeGroup   = "infergate"
	publicGroup = "infergate-nosecrets"
	grpcGroup   = "infergate-grpc"
)

// groups sorts clients by what they can read: grpc-go announces itself in user_agent_name; an Envoy whose
// node id may receive secrets (and whose connection proved it, see access.go) gets them.
type groups struct{ gate *secretGate }

// ID implements go-control-plane's NodeHash.
func (g groups) ID(n *corev3.Node) string {
	switch {
	case strings.HasPrefix(strings.ToLower(n.GetUserAgentName()), "grpc"):
		return grpcGroup
	case g.gate.mayHaveSecrets(n.GetId()):
		return nodeGroup
	}
	return publicGroup
}

// Server serves the resources built from the live policy and fleet state over ADS (and the per-type xDS
// services), state of the world and delta.
type Server struct {
	// Region is the region of the policy's spec.regions whose Envoys this server configures (infergate serve
	// --region): their pools fail over in its order. Set before the first Update.
	Region string

	cache cachev3.SnapshotCache
	log   *slog.Logger
	gate  *secretGate

	mu       sync.Mutex
	digest   [sha256.Size]byte // of the last pushed resources: an unchanged build is not pushed again
	version  int
	weights  map[string]uint32
	warnings string // the last build's warnings, logged when they change
}

// NewServer creates a control plane with an empty snapshot cache. ads=false in the cache keeps grpc-go xDS
// clients, which ask for resources one name at a time, from stalling: an ADS-ordered cache waits for every
// requested name of a type before it answers.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	gate := newSecretGate()
	return &Server{cache: cachev3.NewSnapshotCache(false, groups{gate}, nil), log: log, gate: gate}
}

// AllowSecrets names the Envoy node ids that may receive the managed-API keys; each must prove its id on its
// connection (access.go). Without it no client receives a secret.
func (s *Server) AllowSecrets(nodeIDs ...string) { s.gate.allow(nodeIDs) }

// Register adds the xDS services to g.
func (s *Server) Register(ctx context.Context, g *grpc.Server) {
	srv := serverv3.NewServer(ctx, s.cache, s.gate.callbacks())
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, srv)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, srv)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, srv)
	routeservice.RegisterRouteDiscoveryServiceServer(g, srv)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, srv)
}

// Update builds a new versioned snapshot from the policy and fleet state and pushes it, unless the resources
// fail validation or are inconsistent, in which case the previous snapshot stays.
func (s *Server) Update(snap *policies.Snapshot, fleet FleetState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	res, err := BuildInRegion(snap, fleet, s.weights, s.Region)
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	gres, listeners, err := buildGRPC(snap, fleet, s.weights, s.Region)
	if err != nil {
		return fmt.Errorf("xds (grpc clients): %w", err)
	}
	digest, err := digestOf(res.Clusters, res.Endpoints, res.Routes, res.Secrets, gres.Clusters, gres.Endpoints, gres.Routes, listeners)
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	if s.version > 0 && digest == s.digest {
		// The periodic refresh found nothing new: Envoy keeps what it has, and the log stays quiet.
		s.weights = res.Weights
		return nil
	}
	next := s.version + 1
	cs, err := cachev3.NewSnapshot(strconv.Itoa(next), map[resource.Type][]types.Resource{
		resource.ClusterType:  res.Clusters,
		resource.EndpointType: res.Endpoints,
		resource.RouteType:    res.Routes,
		resource.SecretType:   res.Secrets,
	})
	if err != nil {
		return fmt.Errorf("xds snapshot: %w", err)
	}
	public, err := cachev3.NewSnapshot(strconv.Itoa(next), map[resource.Type][]types.Resource{
		resource.ClusterType:  res.Clusters,
		resource.EndpointType: res.Endpoints,
		resource.RouteType:    res.Routes,
	})
	if err != nil {
		return fmt.Errorf("xds snapshot: %w", err)
	}
	// go-control-plane's Consistent() wants every route configuration named by a listener it serves; ours is
	// named by the bootstrap's static listener, so the references are checked here instead.
	if err := consistent(res); err != nil {
		return fmt.Errorf("xds snapshot inconsistent: %w", err)
	}
	if w := strings.Join(res.Warnings, "; "); w != s.warnings {
		s.warnings = w
		for _, msg := range res.Warnings {
			s.log.Warn("xds: managed-API credential", "problem", msg)
		}
	}
	gs, err := cachev3.NewSnapshot(strconv.Itoa(next), map[resource.Type][]types.Resource{
		resource.ClusterType:  gres.Clusters,
		resource.EndpointType: gres.Endpoints,
		resource.RouteType:    gres.Routes,
		resource.ListenerType: listeners,
	})
	if err != nil {
		return fmt.Errorf("xds snapshot (grpc clients): %w", err)
	}
	if err := s.cache.SetSnapshot(context.Background(), nodeGroup, cs); err != nil {
		return fmt.Errorf("xds set snapshot: %w", err)
	}
	if err := s.cache.SetSnapshot(context.Background(), publicGroup, public); err != nil {
		return fmt.Errorf("xds set snapshot: %w", err)
	}
	if err := s.cache.SetSnapshot(context.Background(), grpcGroup, gs); err != nil {
		return fmt.Errorf("xds set snapshot (grpc clients): %w", err)
	}
	s.version, s.weights, s.digest = next, res.Weights, digest
	s.log.Info("xds snapshot pushed", "version", next, "policy_version", snap.Version,
		"clusters", len(res.Clusters), "endpoints", len(res.Endpoints))
	return nil
}

// digestOf hashes resources in a deterministic encoding, in order.
func digestOf(lists ...[]types.Resource) ([sha256.Size]byte, error) {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, list := range lists {
		for _, r := range list {
			b, err := opts.Marshal(r)
			if err != nil {
				return [sha256.Size]byte{}, err
			}
			h.Write(b)
		}
		h.Write([]byte{0xff}) // list boundary
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

// Version is the last pushed snapshot version (0 before the first).
func (s *Server) Version() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}
