package envoysim

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

// E11 Upstream TLS. A cluster's envoy.transport_sockets.tls UpstreamTlsContext makes its connections TLS, with
// its SNI. Envoy verifies the server only when the context has a validation context: then the chain must lead
// to trusted_ca and a subject alternative name must match one of match_typed_subject_alt_names; without one,
// any certificate is accepted. A trusted_ca file Envoy cannot read rejects the cluster.

// upstreamTLS reads a cluster's TLS transport socket; nil for a plaintext cluster.
func upstreamTLS(c *clusterv3.Cluster) (*tls.Config, error) {
	ts := c.GetTransportSocket()
	if ts == nil {
		return nil, nil
	}
	if ts.GetName() != "envoy.transport_sockets.tls" {
		return nil, fmt.Errorf("cluster %s: transport socket %s is not emulated", c.GetName(), ts.GetName())
	}
	utc := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(utc); err != nil {
		return nil, fmt.Errorf("cluster %s: tls: %w", c.GetName(), err)
	}
	cfg := &tls.Config{ServerName: utc.GetSni(), MinVersion: tls.VersionTLS12,
		// The verification below is Envoy's, not Go's (which would check the SNI name): see E11.
		InsecureSkipVerify: true} //nolint:gosec // verified in VerifyPeerCertificate when Envoy would
	vc := utc.GetCommonTlsContext().GetValidationContext()
	if vc == nil {
		return cfg, nil
	}
	pem, err := os.ReadFile(vc.GetTrustedCa().GetFilename())
	if err != nil {
		return nil, fmt.Errorf("cluster %s: trusted_ca: %w", c.GetName(), err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster %s: trusted_ca %s holds no certificate", c.GetName(), vc.GetTrustedCa().GetFilename())
	}
	matchers := vc.GetMatchTypedSubjectAltNames()
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		return verifyUpstream(raw, roots, matchers)
	}
	return cfg, nil
}

// verifyUpstream checks a server's chain against roots and its names against the SAN matchers (exact ones,
// which is what infergate's control plane writes).
func verifyUpstream(raw [][]byte, roots *x509.CertPool, matchers []*tlsv3.SubjectAltNameMatcher) error {
	if len(raw) == 0 {
		return errors.New("no server certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return err
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: time.Now()}); err != nil {
		return err
	}
	if len(matchers) == 0 {
		return nil
	}
	for _, m := range matchers {
		want := m.GetMatcher().GetExact()
		switch m.GetSanType() {
		case tlsv3.SubjectAltNameMatcher_DNS:
			for _, n := range leaf.DNSNames {
				if n == want {
					return nil
				}
			}
		case tlsv3.SubjectAltNameMatcher_IP_ADDRESS:
			for _, ip := range leaf.IPAddresses {
				if ip.Equal(net.ParseIP(want)) {
					return nil
				}
			}
		}
	}
	return errors.New("no subject alternative name matches")
}

// tlsTransports keeps one HTTP transport per TLS cluster.
type tlsTransports struct {
	mu sync.Mutex
	by map[string]*http.Transport
}

func (t *tlsTransports) get(c *Cluster) *http.Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.by == nil {
		t.by = map[string]*http.Transport{}
	}
	tr := t.by[c.Name]
	if tr == nil {
		tr = &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, TLSClientConfig: c.TLS,
			MaxIdleConnsPerHost: 64}
		t.by[c.Name] = tr
	}
	return tr
}

func (t *tlsTransports) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tr := range t.by {
		tr.CloseIdleConnections()
	}
}
