package helm

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// The certificates the chart draws by default serve mutual TLS as serve uses them: infergate's server
// certificate verifies under every name its Service is reached by, Envoy's client certificate is accepted,
// and a client with no certificate or one from another CA is refused.
func TestGeneratedCertificatesServeMutualTLS(t *testing.T) {
	r := render(t, "")
	server, client := secretNamed(r, "infergate-tls"), secretNamed(r, "infergate-envoy-client")
	ca := configMapNamed(r, "infergate-ca")
	if server == nil || client == nil || ca == nil {
		t.Fatalf("server %v, client %v, CA %v", server != nil, client != nil, ca != nil)
	}
	if server.Type != corev1.SecretTypeTLS || server.Annotations["helm.sh/resource-policy"] != "keep" || client.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("secrets: type %v, annotations %v / %v", server.Type, server.Annotations, client.Annotations)
	}
	if string(server.Data["ca.crt"]) != ca.Data["ca.crt"] || string(client.Data["ca.crt"]) != ca.Data["ca.crt"] {
		t.Error("the server Secret, the client Secret and the ConfigMap carry different CAs")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(ca.Data["ca.crt"])) {
		t.Fatal("the CA ConfigMap holds no PEM certificate")
	}
	serverCert := keyPair(t, server)
	for _, host := range []string{"infergate", "infergate.infergate", "infergate.infergate.svc", "infergate.infergate.svc.cluster.local"} {
		if _, err := serverCert.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	if _, err := serverCert.Leaf.Verify(x509.VerifyOptions{DNSName: "infergate.other.svc", Roots: roots}); err == nil {
		t.Error("the server certificate verifies for another namespace's Service")
	}
	clientCert := keyPair(t, client)
	if cn := clientCert.Leaf.Subject.CommonName; cn != "infergate-envoy-client" {
		t.Errorf("client certificate names %q", cn)
	}
	other := secretNamed(render(t, ""), "infergate-envoy-client") // a second install draws another CA
	for _, tc := range []struct {
		name   string
		certs  []tls.Certificate
		accept bool
	}{
		{"the generated client certificate", []tls.Certificate{clientCert}, true},
		{"no client certificate", nil, false},
		{"a certificate from another install's CA", []tls.Certificate{keyPair(t, other)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(t, &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert,
				MinVersion: tls.VersionTLS12},
				&tls.Config{Certificates: tc.certs, RootCAs: roots, ServerName: "infergate.infergate.svc.cluster.local", MinVersion: tls.VersionTLS12})
			if (err == nil) != tc.accept {
				t.Errorf("handshake: %v, want accepted %v", err, tc.accept)
			}
		})
	}
}

// Envoy's certificate names the node ids that may receive managed-API keys, so serve's --xds-secret-nodes
// check accepts it, and it is a client certificate.
func TestClientCertificateNamesTheSecretNodes(t *testing.T) {
	r := render(t, "testdata/everything.yaml")
	leaf := keyPair(t, secretNamed(r, "infergate-envoy-client")).Leaf
	if leaf.Subject.CommonName != "llm-gateway-envoy" || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "llm-gateway-envoy" {
		t.Errorf("client certificate: CN %q, DNS %v", leaf.Subject.CommonName, leaf.DNSNames)
	}
	var clientAuth bool
	for _, u := range leaf.ExtKeyUsage {
		clientAuth = clientAuth || u == x509.ExtKeyUsageClientAuth
	}
	if !clientAuth {
		t.Errorf("extended key usage %v lacks client authentication", leaf.ExtKeyUsage)
	}
}

// The other TLS settings: off gives kubelet's gRPC probes and no certificates; bringing your own certificates
// mounts them and draws none.
func TestTLSSettings(t *testing.T) {
	for _, tc := range []struct {
		file      string
		grpcProbe bool
		mounted   bool
		nodes     string
	}{
		{"testdata/no-tls.yaml", true, false, "--xds-secret-nodes="},
		{"testdata/own-tls.yaml", false, true, "--xds-secret-nodes=gw-a,gw-b"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			r := render(t, tc.file)
			c := r.infergate(t).Spec.Template.Spec.Containers[0]
			if got := c.ReadinessProbe.GRPC != nil; got != tc.grpcProbe {
				t.Errorf("gRPC readiness probe %v, want %v", got, tc.grpcProbe)
			}
			if mounted(c, "/etc/infergate/tls") != tc.mounted {
				t.Errorf("TLS mounted %v, want %v", !tc.mounted, tc.mounted)
			}
			if len(r.secrets) != 0 || configMapNamed(r, "infergate-ca") != nil {
				t.Errorf("certificates drawn: %d secrets", len(r.secrets))
			}
			args := strings.Join(c.Args, " ")
			if strings.Contains(args, "--tls-cert") == !tc.mounted || !slices.Contains(c.Args, tc.nodes) {
				t.Errorf("args %q, want %s", args, tc.nodes)
			}
		})
	}
}

// An upgrade keeps the certificates it finds (Envoy's copy of the CA stays valid); when one of the two
// Secrets is gone it draws both again, since certificates from two CAs would fail every handshake.
func TestUpgradeKeepsTheCertificates(t *testing.T) {
	first := render(t, "")
	server, client := secretNamed(first, "infergate-tls"), secretNamed(first, "infergate-envoy-client")

	kept := renderIn(t, "", cluster(t, server, client))
	for _, name := range []string{"infergate-tls", "infergate-envoy-client"} {
		before, after := secretNamed(first, name), secretNamed(kept, name)
		for _, key := range []string{"tls.crt", "tls.key", "ca.crt"} {
			if string(before.Data[key]) != string(after.Data[key]) {
				t.Errorf("upgrade redrew %s %s", name, key)
			}
		}
	}
	if configMapNamed(kept, "infergate-ca").Data["ca.crt"] != string(server.Data["ca.crt"]) {
		t.Error("the CA ConfigMap changed on upgrade")
	}

	redrawn := renderIn(t, "", cluster(t, server))
	if string(secretNamed(redrawn, "infergate-tls").Data["ca.crt"]) == string(server.Data["ca.crt"]) {
		t.Error("with the client Secret gone the server certificate kept the old CA")
	}
	if string(secretNamed(redrawn, "infergate-envoy-client").Data["ca.crt"]) != string(secretNamed(redrawn, "infergate-tls").Data["ca.crt"]) {
		t.Error("redrawn certificates from two CAs")
	}
}

func keyPair(t *testing.T, s *corev1.Secret) tls.Certificate {
	t.Helper()
	if s == nil {
		t.Fatal("no Secret")
	}
	c, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		t.Fatalf("%s: %v", s.Name, err)
	}
	return c // Leaf is parsed by X509KeyPair since Go 1.23
}

// handshake runs a TLS handshake over an in-memory pipe and returns the server's verdict.
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		c := tls.Client(b, clientCfg)
		err := c.Handshake()
		if err == nil {
			_, err = c.Read(make([]byte, 1)) // TLS 1.3: a refused client certificate arrives as an alert after the handshake
		}
		b.Close()
		done <- err
	}()
	s := tls.Server(a, serverCfg)
	err := s.Handshake()
	if err == nil {
		_, err = s.Write([]byte{1})
	}
	a.Close()
	<-done
	return err
}

// cluster serves the given Secrets to the chart's lookup, as a cluster holding them would.
func cluster(t *testing.T, secrets ...*corev1.Secret) engine.ClientProvider {
	t.Helper()
	var objs []runtime.Object
	for _, s := range secrets {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{Object: u}
		obj.SetAPIVersion("v1")
		obj.SetKind("Secret")
		obj.SetNamespace("infergate")
		objs = append(objs, obj)
	}
	return fakeProvider{dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), objs...)}
}

type fakeProvider struct{ client dynamic.Interface }

func (p fakeProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	return p.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: strings.ToLower(kind) + "s"}), true, nil
}
