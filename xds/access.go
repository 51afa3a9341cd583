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
//
// A client whose verified certificate names an allowed id may also receive secrets under a node id it cannot
// choose — an Istio ingress gateway's is istiod's "router~<ip>~<pod>…" (deploy/istio): its connection vouches
// for that node id while it is open, and another connection claiming the same node id must prove an allowed
// identity too, or is refused.

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
	// vouched are node ids an open connection with an allowed identity claimed, by how many such streams;
	// vouchedBy the node id each of those streams vouched for.
	vouched   map[string]int
	vouchedBy map[int64]string
}

func newSecretGate() *secretGate {
	return &secretGate{allowed: map[string]bool{}, streams: map[int64]Peer{}, vouched: map[string]int{}, vouchedBy: map[int64]string{}}
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
	return g.allowed[id] || g.vouched[id] > 0
}

// check refuses a request whose node claims an allowed id the stream's connection does not prove, or a node id
// another connection vouched for with an identity this one lacks; a connection whose certificate names an
// allowed identity vouches for the node id it claims.
func (g *secretGate) check(streamID int64, node *corev3.Node) error {
	if node == nil {
		return nil
	}
	id := node.GetId()
	g.mu.Lock()
	defer g.mu.Unlock()
	p := g.streams[streamID]
	switch {
	case g.allowed[id]:
		if !p.Proves(id) {
			return status.Error(codes.PermissionDenied, fmt.Sprintf(
				"node id %q may receive secrets, and this connection does not prove it: present a client certificate naming it", id))
		}
	case g.namesAllowed(p):
		if _, done := g.vouchedBy[streamID]; !done {
			g.vouchedBy[streamID] = id
			g.vouched[id]++
		}
	case g.vouched[id] > 0:
		return status.Error(codes.PermissionDenied, fmt.Sprintf(
			"node id %q is in use by a client certified to receive secrets, and this connection is not", id))
	}
	return nil
}

// namesAllowed says whether a connection's verified certificate names an allowed identity.
func (g *secretGate) namesAllowed(p Peer) bool {
	for _, n := range p.Names {
		if g.allowed[n] {
			return true
		}
	}
	return false
}

func (g *secretGate) open(ctx context.Context, streamID int64) {
	p := PeerOf(ctx)
	g.mu.Lock()
	g.streams[streamID] = p
	g.mu.Unlock()
}

func (g *secretGate) closed(streamID int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.streams, streamID)
	if id, ok := g.vouchedBy[streamID]; ok {
		delete(g.vouchedBy, streamID)
		if g.vouched[id]--; g.vouched[id] <= 0 {
			delete(g.vouched, id)
		}
	}
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
