// Package tlstest makes a throwaway certificate authority and certificates signed by it, for tests of mTLS
// between infergate and its clients.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that lives for one test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is a certificate with its key, in PEM and parsed.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Cert            tls.Certificate
	Serial          *big.Int
}

// Server issues a server certificate for 127.0.0.1 and localhost.
func (ca *CA) Server(t testing.TB) *Leaf {
	return ca.issue(t, "infergate", nil, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate with the common name and URI SANs given.
func (ca *CA) Client(t testing.TB, commonName string, uris ...string) *Leaf {
	t.Helper()
	var us []*url.URL
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		us = append(us, parsed)
	}
	return ca.issue(t, commonName, us, nil, nil, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(t testing.TB, cn string, uris []*url.URL, dns []string, ips []net.IP, usage x509.ExtKeyUsage) *Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn}, URIs: uris, DNSNames: dns,
		IPAddresses: ips, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), Serial: tmpl.SerialNumber}
	l.Cert, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Write stores the leaf as cert.pem and key.pem in dir and returns their paths.
func (l *Leaf) Write(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, l.CertPEM)
	writeFile(t, keyFile, l.KeyPEM)
	return certFile, keyFile
}

// WriteCA stores the CA certificate as ca.pem in dir and returns its path.
func (ca *CA) WriteCA(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "ca.pem")
	writeFile(t, p, ca.PEM)
	return p
}

// ClientConfig is a TLS client configuration that trusts serverCA and presents leaf (nil: no certificate).
func ClientConfig(serverCA *CA, leaf *Leaf) *tls.Config {
	c := &tls.Config{RootCAs: serverCA.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if leaf != nil {
		c.Certificates = []tls.Certificate{leaf.Cert}
	}
	return c
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	// Write and rename, as a secret mount or cert-manager does, so a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
