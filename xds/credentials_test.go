package xds

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

const providerKey = "sk-provider-0123456789"

// The managed API's key goes to its cluster only, as an SDS secret the credential injector reads: it appears
// in no cluster, route or log, and pool clusters inject nothing.
func TestFallbackCredentialInjection(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(providerKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, apiKeyFrom, env string
		injected              bool
	}{
		{"from the environment", "env:TOGETHER_API_KEY", providerKey, true},
		{"from a file", "file:" + keyFile, "", true},
		{"missing: a warning, no injector", "env:TOGETHER_API_KEY", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TOGETHER_API_KEY", tc.env)
			snap := withKeySource(t, tc.apiKeyFrom)
			res, err := Build(snap, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			secret := contract.SecretName("llama-3.3-70b", "together")
			for _, r := range res.Clusters {
				c := r.(*clusterv3.Cluster)
				refs := secretRefs(c)
				switch {
				case c.GetName() == contract.FallbackClusterName("llama-3.3-70b", "together") && tc.injected:
					if len(refs) != 1 || refs[0] != secret {
						t.Errorf("fallback cluster injects %v, want %s", refs, secret)
					}
				case len(refs) > 0:
					t.Errorf("cluster %s injects %v", c.GetName(), refs)
				}
			}
			if tc.injected {
				if len(res.Secrets) != 1 || res.Secrets[0].(*tlsv3.Secret).GetGenericSecret().GetSecret().GetInlineString() != "Bearer "+providerKey {
					t.Fatalf("secrets %v", res.Secrets)
				}
			} else if len(res.Secrets) != 0 || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "TOGETHER_API_KEY") {
				t.Errorf("secrets %d, warnings %v", len(res.Secrets), res.Warnings)
			}
			for _, group := range [][]types.Resource{res.Clusters, res.Endpoints, res.Routes} {
				for _, r := range group {
					js, _ := protojson.Marshal(r.(proto.Message))
					if strings.Contains(string(js), providerKey) {
						t.Errorf("the key leaked into %T", r)
					}
				}
			}
			if err := consistent(res); err != nil {
				t.Error(err)
			}
		})
	}
}

// The server serves the secret to Envoy over ADS (not to proxyless gRPC clients, which have no TLS
// fallbacks), and says once in its log — without the key — when a fallback has none.
func TestServerServesSecretsAndWarnsOnce(t *testing.T) {
	var logs bytes.Buffer
	s := NewServer(slog.New(slog.NewTextHandler(&logs, nil)))
	s.AllowSecrets("envoy-1")
	t.Setenv("TOGETHER_API_KEY", "")
	for range 3 {
		if err := s.Update(quickstart(t), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "TOGETHER_API_KEY"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
	t.Setenv("TOGETHER_API_KEY", providerKey)
	if err := s.Update(quickstart(t), nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), providerKey) {
		t.Fatal("the key reached the log")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := dialServed(t, func(gs *grpc.Server) { s.Register(ctx, gs) })
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name := contract.SecretName("llama-3.3-70b", "together")
	if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1", UserAgentName: "envoy"},
		TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ads.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var sec tlsv3.Secret
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].UnmarshalTo(&sec) != nil || sec.GetName() != name ||
		sec.GetGenericSecret().GetSecret().GetInlineString() != "Bearer "+providerKey {
		t.Errorf("SDS answer %v", resp.GetResources())
	}
}

// withKeySource loads the quickstart policy with the fallback's apiKeyFrom replaced.
func withKeySource(t *testing.T, from string) *policies.Snapshot {
	t.Helper()
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := policies.Parse("policy.yaml", []byte(strings.Replace(string(src), "apiKeyFrom: env:TOGETHER_API_KEY", "apiKeyFrom: \""+from+"\"", 1)))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}
