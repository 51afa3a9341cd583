package xds

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Managed-API keys travel to Envoy as SDS secrets, so who may read them is decided here. A client receives
// secrets only when its node id is one the operator allowed (Server.AllowSecrets) and the connection proves
// that id: a client certificate, verified against the server's client CA, that names it (URI SAN, DNS SAN or
// common name) — or, where the server runs without TLS, a loopback connection (Envoy beside infergate on one
// host, the default bind). Every other client gets the same clusters and routes without any secret; a client
// that claims an allowed id it cannot prove is refused.

// Peer is what a connection proves about its client.
type Peer struct {
	// Names are the identities of a verified client certificate; empty without one.
	Names []string
	// TLS is set when the connection is TLS; Loopback when the client is on this host.
	TLS, Loopback bool
}

// PeerOf reads the client's proof from a gRPC context.
func PeerOf(ctx context.Context) Peer {
	var out Peer
	p, ok := peer.FromContext(ctx)
	if !ok {
		return out
	}
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		out.Loopback = ap.Addr().Unmap().IsLoopback()
	} else if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		ip := net.ParseIP(host)
		out.Loopback = ip != nil && ip.IsLoopback()
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		out.TLS = true
		if len(ti.State.VerifiedChains) > 0 && len(ti.State.PeerCertificates) > 0 {
			c := ti.State.PeerCertificates[0]
			for _, u := range c.URIs {
				out.Names = append(out.Names, u.String())
			}
			out.Names = append(out.Names, c.DNSNames...)
			if c.Subject.CommonName != "" {
				out.Names = append(out.Names, c.Subject.CommonName)
			}
		}
	}
	return out
}

// Trusted reports whether the client is authenticated at all: a verified certificate, or loopback without
// TLS.
func (p Peer) Trusted() bool { return len(p.Names) > 0 || (p.Loopback && !p.TLS) }

// Proves reports whether the connection proves the node id.
func (p Peer) Proves(id string) bool {
	return slices.Contains(p.Names, id) || (p.Loopback && !p.TLS)
}

// secretGate remembers each open stream's peer and checks the node ids it claims.
type secretGate struct {
	mu      sync.RWMutex
	allowed map[string]bool
	streams map[int64]Peer
}

func newSecretGate() *secretGate {
	return &secretGate{allowed: map[string]bool{}, streams: map[int64]Peer{}}
}

func (g *secretGate) allow(ids []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allowed = map[string]bool{}
	for _, id := range ids {
		if id != "" {
			g.allowed[id] = true
		}
	}
}

func (g *secretGate) mayHaveSecrets(id string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.allowed[id]
}

// check refuses a request whose node claims an allowed id the stream's connection does not prove.
func (g *secretGate) check(streamID int64, node *corev3.Node) error {
	if node == nil || !g.mayHaveSecrets(node.GetId()) {
		return nil
	}
	g.mu.RLock()
	p := g.streams[streamID]
	g.mu.RUnlock()
	if !p.Proves(node.GetId()) {
		return status.Error(codes.PermissionDenied, fmt.Sprintf(
			"node id %q may receive secrets, and this connection does not prove it: present a client certificate naming it", node.GetId()))
	}
	return nil
}

func (g *secretGate) open(ctx context.Context, streamID int64) {
	p := PeerOf(ctx)
	g.mu.Lock()
	g.streams[streamID] = p
	g.mu.Unlock()
}

func (g *secretGate) closed(streamID int64) {
	g.mu.Lock()
	delete(g.streams, streamID)
	g.mu.Unlock()
}

// callbacks wires the gate into go-control-plane's stream handling, state of the world and delta alike.
func (g *secretGate) callbacks() serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamOpenFunc:         func(ctx context.Context, id int64, _ string) error { g.open(ctx, id); return nil },
		StreamClosedFunc:       func(id int64, _ *corev3.Node) { g.closed(id) },
		DeltaStreamOpenFunc:    func(ctx context.Context, id int64, _ string) error { g.open(ctx, id); return nil },
		DeltaStreamClosedFunc:  func(id int64, _ *corev3.Node) { g.closed(id) },
		StreamRequestFunc:      func(id int64, r *discoverygrpc.DiscoveryRequest) error { return g.check(id, r.GetNode()) },
		StreamDeltaRequestFunc: func(id int64, r *discoverygrpc.DeltaDiscoveryRequest) error { return g.check(id, r.GetNode()) },
	}
}
