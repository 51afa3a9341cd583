package main

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
)

// tlsFiles serves a certificate, its key and a client CA from files and picks up new ones when they change
// (cert-manager and Kubernetes secret mounts replace them in place), without a restart. A change that does not
// load — a half-written pair, a CA that does not parse — leaves the previous configuration serving and is
// logged.
type tlsFiles struct {
	certFile, keyFile, clientCAFile string
	log                             *slog.Logger

	mu      sync.Mutex
	stamp   [sha256.Size]byte // digest of every file's contents, as last loaded
	current *tls.Config
}

// newTLSFiles loads the files once; an error here stops serve, since nothing could be served.
func newTLSFiles(certFile, keyFile, clientCAFile string, log *slog.Logger) (*tlsFiles, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	f := &tlsFiles{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile, log: log}
	stamp, err := f.fileStamp()
	if err != nil {
		return nil, err
	}
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	f.stamp, f.current = stamp, cfg
	return f, nil
}

// ServerConfig is the configuration to hand to a listener: every handshake asks for the current files.
func (f *tlsFiles) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, GetConfigForClient: f.forClient}
}

func (f *tlsFiles) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stamp, err := f.fileStamp(); err == nil && stamp != f.stamp {
		if cfg, err := f.load(); err != nil {
			f.log.Error("TLS files changed but do not load; still serving the previous certificate", "err", err)
		} else {
			f.current = cfg
			f.log.Info("TLS certificate reloaded", "cert", f.certFile)
		}
		f.stamp = stamp // a broken change is reported once, not at every handshake
	}
	return f.current, nil
}

// fileStamp digests the files' contents: a handshake is rare on long-lived gRPC connections, and contents,
// unlike modification times, cannot hide a rewrite within one clock tick.
func (f *tlsFiles) fileStamp() ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, p := range []string{f.certFile, f.keyFile, f.clientCAFile} {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return [sha256.Size]byte{}, fmt.Errorf("TLS file: %w", err)
		}
		h.Write(b)
		h.Write([]byte{0})
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

func (f *tlsFiles) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{pair}}
	if f.clientCAFile != "" {
		pem, err := os.ReadFile(f.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS client CA %s holds no PEM certificate", f.clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
