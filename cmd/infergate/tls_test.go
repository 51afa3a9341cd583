package main

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/test/manifest"
	"github.com/infergate/infergate/test/tlstest"
)

// serverSerial handshakes with addr as a client presenting leaf and returns the server certificate's serial.
func serverSerial(t *testing.T, addr string, ca *tlstest.CA, leaf *tlstest.Leaf) (string, error) {
	t.Helper()
	cfg := tlstest.ClientConfig(ca, leaf)
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// serve with --tls-cert/--tls-key/--tls-client-ca: gRPC clients need a certificate from the client CA, and a
// rotated certificate is served to the next connection without a restart.
func TestServeMutualTLSAndReload(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca")
	first := serverCA.Server(t)
	certFile, keyFile := first.Write(t, dir)
	caFile := clientCA.WriteCA(t, dir)

	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"serve", "--policy", quickstart, "--extproc-addr", "127.0.0.1:0", "--metrics-addr", "", "--admin-addr", "",
			"--xds-addr", "", "--scrape-interval", "0", "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile}, io.Discard, logs.w)
	}()
	addr := logs.waitFor(t, "ext_proc listening")["addr"].(string)
	client := clientCA.Client(t, "envoy-1")

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(serverCA, client))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if hs, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"}); err != nil || hs.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("mTLS client: %v %v", hs, err)
	}
	anon, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlstest.ClientConfig(serverCA, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a client without a certificate was answered")
	}

	if got, err := serverSerial(t, addr, serverCA, client); err != nil || got != first.Serial.String() {
		t.Fatalf("serial %s %v, want %s", got, err, first.Serial)
	}
	second := serverCA.Server(t)
	second.Write(t, dir)
	if got, err := serverSerial(t, addr, serverCA, client); err != nil || got != second.Serial.String() {
		t.Errorf("after rotation: serial %s %v, want the new certificate %s", got, err, second.Serial)
	}
	// A broken rewrite leaves the last good certificate serving.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := serverSerial(t, addr, serverCA, client); err != nil || got != second.Serial.String() {
		t.Errorf("after a broken rewrite: serial %s %v, want the previous good %s", got, err, second.Serial)
	}
	cancel()
	if code := <-exit; code != 0 {
		t.Errorf("serve exit %d", code)
	}
}

func TestTLSFilesRefuseBadStart(t *testing.T) {
	dir := t.TempDir()
	if _, err := newTLSFiles(filepath.Join(dir, "missing.pem"), filepath.Join(dir, "missing.key"), "", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("missing files accepted")
	}
	leaf := tlstest.NewCA(t, "ca").Server(t)
	certFile, keyFile := leaf.Write(t, dir)
	bad := filepath.Join(dir, "bad-ca.pem")
	if err := os.WriteFile(bad, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newTLSFiles(certFile, keyFile, bad, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a client CA without certificates accepted")
	}
	if _, err := newTLSFiles(certFile, "", "", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a certificate without its key accepted")
	}
}

// Every listener binds loopback unless the operator says otherwise.
func TestServeBindsLoopbackByDefault(t *testing.T) {
	var cfg serveConfig
	if err := serveFlags(&cfg, io.Discard).Parse(nil); err != nil {
		t.Fatal(err)
	}
	for name, addr := range map[string]string{"extproc": cfg.extprocAddr, "xds": cfg.xdsAddr, "metrics": cfg.metricsAddr} {
		if !loopbackAddr(addr) {
			t.Errorf("--%s-addr defaults to %q, not loopback", name, addr)
		}
	}
	if cfg.egAddr != "" {
		t.Errorf("the Envoy Gateway hook is on by default at %q", cfg.egAddr)
	}
}

// The Kubernetes Deployment's arguments parse with serve's real flags, its gRPC ports are behind mTLS, and what
// its replicas share over Redis is signed with a key mounted from a Secret.
func TestKubernetesDeploymentArgs(t *testing.T) {
	for _, doc := range manifest.DecodeAll(t, "../../deploy/kubernetes/infergate.yaml") {
		if doc["kind"] != "Deployment" {
			continue
		}
		c := manifest.Get(doc, "spec", "template", "spec", "containers").([]any)[0]
		var args []string
		for _, a := range manifest.Get(c, "args").([]any) {
			args = append(args, a.(string))
		}
		if len(args) == 0 || args[0] != "serve" {
			t.Fatalf("args %v", args)
		}
		var cfg serveConfig
		if err := serveFlags(&cfg, io.Discard).Parse(args[1:]); err != nil {
			t.Fatal(err)
		}
		if cfg.tlsCert == "" || cfg.tlsKey == "" || cfg.tlsClientCA == "" {
			t.Errorf("the Deployment binds %s without mTLS", cfg.extprocAddr)
		}
		if cfg.redisAddr != "" && !mountedFromSecret(doc, c, cfg.messageKeyFile) {
			t.Errorf("the replicas share over Redis without a message key from a Secret (--redis-message-key-file %q)", cfg.messageKeyFile)
		}
		return
	}
	t.Fatal("no Deployment")
}

// mountedFromSecret reports whether path lies under one of the container's mounts of a Secret volume.
func mountedFromSecret(deployment map[string]any, container any, path string) bool {
	secrets := map[string]bool{}
	for _, v := range manifest.Get(deployment, "spec", "template", "spec", "volumes").([]any) {
		if s, ok := v.(map[string]any)["secret"]; ok && s != nil {
			secrets[v.(map[string]any)["name"].(string)] = true
		}
	}
	for _, m := range manifest.Get(container, "volumeMounts").([]any) {
		mount := m.(map[string]any)
		if secrets[mount["name"].(string)] && path != "" && strings.HasPrefix(path, mount["mountPath"].(string)+"/") {
			return true
		}
	}
	return false
}

// The production binary carries neither the simulated fleet nor its fault-injection API, nor any other test
// package.
func TestProductBinaryImportsNoTestPackage(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/infergate/infergate/test/") {
			t.Errorf("infergate imports %s", p)
		}
	}
}

func TestVersionOf(t *testing.T) {
	bi := func(main string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Version: main}, Settings: settings}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "0123456789abcdef0123"}
	dirty := debug.BuildSetting{Key: "vcs.modified", Value: "true"}
	for _, tc := range []struct {
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"v1.4.0", bi("(devel)", rev), "v1.4.0"},
		{"dev", bi("v1.3.2"), "v1.3.2"},
		{"dev", bi("(devel)", rev), "dev-0123456789ab"},
		{"dev", bi("(devel)", rev, dirty), "dev-0123456789ab+dirty"},
		{"dev", bi("(devel)"), "dev"},
		{"dev", nil, "dev"},
	} {
		if got := versionOf(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("versionOf(%q, %+v) = %q, want %q", tc.stamped, tc.bi, got, tc.want)
		}
	}
}
