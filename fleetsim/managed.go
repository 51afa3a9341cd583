package fleetsim

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// ManagedConfig describes a fake managed inference API (a Together or Fireworks stand-in).
type ManagedConfig struct {
	Name  string `yaml:"name"`
	Addr  string `yaml:"addr"`
	Model string `yaml:"model"` // the provider's model name, which differs from the self-hosted one
	// APIKey is the bearer key the API requires.
	APIKey string `yaml:"apiKey"`
	// Latency is the fixed network and queueing delay before a request starts (simulated time).
	Latency time.Duration `yaml:"latency"`
	// TimePerToken is the provider's decode speed (simulated time).
	TimePerToken time.Duration `yaml:"timePerToken"`
	// CAFile, when set, receives the PEM certificate clients must trust.
	CAFile string `yaml:"caFile"`
}

// Managed is a running fake managed API.
type Managed struct {
	*Replica
	// CertPEM is the self-signed certificate the API serves, for clients' trust stores.
	CertPEM []byte
}

// StartManaged runs a managed API with a fresh self-signed certificate for 127.0.0.1 and localhost.
func StartManaged(ctx context.Context, cfg ManagedConfig, timeScale float64) (*Managed, error) {
	if cfg.Latency == 0 {
		cfg.Latency = 250 * time.Millisecond
	}
	if cfg.TimePerToken == 0 {
		cfg.TimePerToken = 15 * time.Millisecond
	}
	certPEM, tlsCert, err := selfSigned(cfg.Name)
	if err != nil {
		return nil, err
	}
	if cfg.CAFile != "" {
		if err := os.WriteFile(cfg.CAFile, certPEM, 0o644); err != nil {
			return nil, fmt.Errorf("managed %s: write CA file: %w", cfg.Name, err)
		}
	}
	// A provider has effectively unbounded capacity: fast prefill, no batch slowdown, room for everyone.
	r := newReplica(ReplicaConfig{Name: cfg.Name, Addr: cfg.Addr, Model: cfg.Model, Hardware: "managed",
		NumGPUBlocks: 1 << 20, MaxNumSeqs: 1 << 16}, Hardware{PrefillTokensPerSecond: 1e6, DecodeStep: cfg.TimePerToken}, timeScale)
	r.tlsConfig = &tls.Config{Certificates: []tls.Certificate{tlsCert}, MinVersion: tls.VersionTLS12}
	r.apiKey = cfg.APIKey
	r.delay = time.Duration(float64(cfg.Latency) * timeScale)
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	return &Managed{Replica: r, CertPEM: certPEM}, nil
}

func selfSigned(name string) ([]byte, tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name + ".managed.test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost", name + ".managed.test"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("self-signed certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	return certPEM, cert, err
}
