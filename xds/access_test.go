package xds

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/gateway/proto/extension"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/tlstest"
	"github.com/infergate/infergate/test/wait"
)

// askSecret opens an ADS stream as node id and asks for the fallback's secret; it returns the secret value, or
// the stream's error.
func askSecret(t *testing.T, conn *grpc.ClientConn, id string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return "", err
	}
	name := contract.SecretName("llama-3.3-70b", "together")
	// Clusters first: every Envoy gets them, and the answer shows the stream was served.
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id, UserAgentName: "envoy"}, TypeUrl: resource.ClusterType}); err != nil {
		return "", err
	}
	resp, err := ads.Recv()
	if err != nil {
		return "", err
	}
	if len(resp.GetResources()) == 0 {
		t.Fatalf("%s got no clusters", id)
	}
	if err := ads.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		return "", err
	}
	// A node without secrets gets no answer for them: wait briefly for one, as Envoy would keep waiting.
	got := make(chan *discoveryv3.DiscoveryResponse, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := ads.Recv()
		if err != nil {
			errc <- err
			return
		}
		got <- r
	}()
	select {
	case r := <-got:
		var sec tlsv3.Secret
		if len(r.GetResources()) != 1 || r.GetResources()[0].UnmarshalTo(&sec) != nil {
			t.Fatalf("secret answer %v", r)
		}
		return sec.GetGenericSecret().GetSecret().GetInlineString(), nil
	case err := <-errc:
		return "", err
	case <-time.After(500 * time.Millisecond):
		return "", nil
	}
}

// Over loopback without TLS (the default bind), only the allowed node ids receive the key.
func TestSecretsOnlyToAllowedNodes(t *testing.T) {
	t.Setenv("TOGETHER_API_KEY", providerKey)
	s := NewServer(nil)
	s.AllowSecrets("envoy-quickstart")
	if err := s.Update(quickstart(t), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn := dialServed(t, func(gs *grpc.Server) { s.Register(ctx, gs) })
	if v, err := askSecret(t, conn, "envoy-quickstart"); err != nil || v != "Bearer "+providerKey {
		t.Errorf("allowed node: %q %v", v, err)
	}
	if v, err := askSecret(t, conn, "anonymous"); err != nil || v != "" {
		t.Errorf("an anonymous node received %q (%v)", v, err)
	}
	pub, err := s.cache.GetSnapshot(publicGroup)
	if err != nil || len(pub.GetResources(resource.SecretType)) != 0 || len(pub.GetResources(resource.ClusterType)) == 0 {
		t.Errorf("public snapshot: %v", err)
	}
}

// mtlsSecrets serves the quickstart's resources over mutual TLS, allowing secrets to the named ids, and returns
// the server, the client CA and a dialer presenting a leaf of it (nil: no certificate).
func mtlsSecrets(t *testing.T, allowed ...string) (*Server, *tlstest.CA, func(*tlstest.Leaf) *grpc.ClientConn) {
	t.Helper()
	t.Setenv("TOGETHER_API_KEY", providerKey)
	serverCA, clientCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca")
	s := NewServer(nil)
	s.AllowSecrets(allowed...)
	if err := s.Update(quickstart(t), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCA.Server(t).Cert},
		ClientCAs: clientCA.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	s.Register(ctx, gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	dial := func(leaf *tlstest.Leaf) *grpc.ClientConn {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(serverCA, leaf))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	return s, clientCA, dial
}

// With mTLS, an allowed node id must be named by the client's verified certificate; a client that claims
// it with another certificate is refused, and one without a certificate cannot connect.
func TestSecretsNeedACertificateNamingTheNode(t *testing.T) {
	_, clientCA, dial := mtlsSecrets(t, "envoy-1")
	if v, err := askSecret(t, dial(clientCA.Client(t, "envoy-1")), "envoy-1"); err != nil || v != "Bearer "+providerKey {
		t.Errorf("certificate naming the node: %q %v", v, err)
	}
	if v, err := askSecret(t, dial(clientCA.Client(t, "intruder")), "envoy-1"); status.Code(err) != codes.PermissionDenied || v != "" {
		t.Errorf("a certificate for another name claiming envoy-1: %q %v", v, err)
	}
	if v, err := askSecret(t, dial(clientCA.Client(t, "intruder")), "intruder"); err != nil || v != "" {
		t.Errorf("an unlisted node received %q (%v)", v, err)
	}
	if _, err := askSecret(t, dial(nil), "envoy-1"); err == nil {
		t.Error("a client without a certificate was served")
	}
	other := tlstest.NewCA(t, "other-ca")
	if _, err := askSecret(t, dial(other.Client(t, "envoy-1")), "envoy-1"); err == nil {
		t.Error("a certificate from an unknown CA was served")
	}
}

// A gateway whose node id it cannot choose (Istio's ingress gateway: "router~<ip>~<pod>…") receives the key
// when its certificate names an allowed identity; while it is connected, another client claiming its node id
// without such a certificate is refused, and once it has gone that node id is nobody's again.
func TestACertifiedIdentityVouchesForItsNodeID(t *testing.T) {
	s, clientCA, dial := mtlsSecrets(t, "infergate-envoy-client")
	const istioNode = "router~10.0.0.7~istio-ingressgateway-5d9f.istio-system~istio-system.svc.cluster.local"
	gateway := dial(clientCA.Client(t, "infergate-envoy-client"))
	// The gateway's stream stays open while the intruder tries.
	sctx, closeGateway := context.WithCancel(context.Background())
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(gateway).StreamAggregatedResources(sctx)
	if err != nil {
		t.Fatal(err)
	}
	name := contract.SecretName("llama-3.3-70b", "together")
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: istioNode}, TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ads.Recv()
	var sec tlsv3.Secret
	if err != nil || len(resp.GetResources()) != 1 || resp.GetResources()[0].UnmarshalTo(&sec) != nil ||
		sec.GetGenericSecret().GetSecret().GetInlineString() != "Bearer "+providerKey {
		t.Fatalf("the certified gateway under istiod's node id: %v, %v", resp, err)
	}
	if v, err := askSecret(t, dial(clientCA.Client(t, "intruder")), istioNode); status.Code(err) != codes.PermissionDenied || v != "" {
		t.Errorf("an uncertified client claiming the gateway's node id: %q %v", v, err)
	}
	closeGateway()
	// Once the gateway's stream is gone, its node id vouches for nobody.
	wait.Within(t, "the closed stream noticed", 10*time.Second, func() bool { return !s.gate.mayHaveSecrets(istioNode) })
	if v, err := askSecret(t, dial(clientCA.Client(t, "intruder")), istioNode); err != nil || v != "" {
		t.Errorf("after the gateway left, its node id: %q %v", v, err)
	}
}

func TestPeerProof(t *testing.T) {
	at := func(ip string) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 5000}})
	}
	if p := PeerOf(at("127.0.0.1")); !p.Proves("envoy-1") || !p.Trusted() {
		t.Error("loopback without TLS should prove its node id")
	}
	if p := PeerOf(at("::1")); !p.Proves("envoy-1") {
		t.Error("IPv6 loopback without TLS should prove its node id")
	}
	if p := PeerOf(at("10.0.0.5")); p.Proves("envoy-1") || p.Trusted() {
		t.Error("a remote client without a certificate proves nothing")
	}
	if p := PeerOf(context.Background()); p.Trusted() {
		t.Error("no peer is not trusted")
	}
}

// The Envoy Gateway hook's answer holds the keys: a remote caller without a verified certificate is refused.
func TestEnvoyGatewayHookRefusesUnauthenticatedCallers(t *testing.T) {
	h := &EnvoyGatewayHook{Policy: func() *policies.Snapshot { return quickstart(t) }}
	remote := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 4000}})
	if _, err := h.PostTranslateModify(remote, &pb.PostTranslateModifyRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("remote caller without a certificate: %v", err)
	}
	local := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 4000}})
	if _, err := h.PostTranslateModify(local, &pb.PostTranslateModifyRequest{}); err != nil {
		t.Errorf("loopback caller: %v", err)
	}
}

// The periodic refresh pushes (and logs) a snapshot only when the resources changed.
func TestUnchangedSnapshotIsNotPushed(t *testing.T) {
	var logs strings.Builder
	s := NewServer(slog.New(slog.NewTextHandler(&logs, nil)))
	for range 5 {
		if err := s.Update(quickstart(t), nil); err != nil {
			t.Fatal(err)
		}
	}
	if v := s.Version(); v != 1 {
		t.Errorf("version %d after five identical updates, want 1", v)
	}
	if n := strings.Count(logs.String(), "xds snapshot pushed"); n != 1 {
		t.Errorf("logged %d pushes, want 1", n)
	}
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	changed, err := policies.Parse("policy.yaml", []byte(strings.Replace(string(src), "127.0.0.1:", "127.0.0.2:", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Update(changed, nil); err != nil {
		t.Fatal(err)
	}
	if v := s.Version(); v != 2 {
		t.Errorf("version %d after a change, want 2", v)
	}
}
