package xds

import (
	"fmt"
	"os"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	credinjectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/credential_injector/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	upstreamcodecv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/upstream_codec/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	genericv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/injected_credentials/generic/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// A managed API's key reaches it through Envoy, never through infergate's request path: the fallback cluster
// runs the credential_injector filter as an upstream HTTP filter, so the key is added to requests leaving for
// that cluster only — self-hosted replicas never see it — and the filter reads the key from a generic SDS
// secret that this control plane serves over ADS, so it appears in no cluster, route or log.

// fallbackKey reads a fallback's API key from where the policy says it lives ("env:NAME" or "file:/path").
// Errors name the source, never the key.
func fallbackKey(f *policies.Fallback) (string, error) {
	kind, ref, _ := strings.Cut(f.APIKeyFrom, ":")
	var key string
	switch kind {
	case "env":
		key = os.Getenv(ref)
	case "file":
		b, err := os.ReadFile(ref)
		if err != nil {
			return "", fmt.Errorf("fallback %s: key file: %w", f.Name, err)
		}
		key = string(b)
	default:
		return "", fmt.Errorf("fallback %s: apiKeyFrom %q names neither an environment variable nor a file", f.Name, f.APIKeyFrom)
	}
	if key = strings.TrimSpace(key); key == "" {
		return "", fmt.Errorf("fallback %s: no API key in %s", f.Name, f.APIKeyFrom)
	}
	return key, nil
}

// credentialSecret is the generic secret the injector puts in the Authorization header.
func credentialSecret(name, key string) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{
		Secret: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: "Bearer " + key}}}}}
}

// upstreamFilters gives a fallback cluster its upstream filter chain, which runs once per attempt to the
// managed API whichever way the request got there (infergate's overflow decision, or an Envoy retry away from
// a failing pool):
//   - an ext_proc filter calling infergate with the model and fallback as gRPC metadata, which renames the
//     body's model to the provider's (a retried request still names the pool's served model, and Envoy does
//     not run the downstream ext_proc again); if infergate cannot be reached the attempt goes on unchanged;
//   - when the fallback has a key (secret non-empty), the credential injector, which sets Authorization from
//     the SDS secret (replacing whatever the client sent) on this cluster only;
//   - the upstream codec.
func upstreamFilters(c *clusterv3.Cluster, model, fallback, secret string) {
	rename := &extprocfilterv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: ExtProcClusterName}},
			InitialMetadata: []*corev3.HeaderValue{{Key: contract.LegModelMetadata, Value: model}, {Key: contract.LegFallbackMetadata, Value: fallback}},
		},
		FailureModeAllow: true,
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestHeaderMode: extprocfilterv3.ProcessingMode_SEND, RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED,
			ResponseHeaderMode: extprocfilterv3.ProcessingMode_SKIP, RequestTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
		},
		MessageTimeout: durationpb.New(time.Second),
	}
	filters := []*hcmv3.HttpFilter{{Name: "envoy.filters.http.ext_proc", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(rename)}}}
	if secret != "" {
		ads := &corev3.ConfigSource{ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			ResourceApiVersion: corev3.ApiVersion_V3}
		injector := &credinjectorv3.CredentialInjector{
			Overwrite: true,
			Credential: &corev3.TypedExtensionConfig{Name: "envoy.http.injected_credentials.generic", TypedConfig: mustAny(&genericv3.Generic{
				Credential: &tlsv3.SdsSecretConfig{Name: secret, SdsConfig: ads}, Header: "Authorization"})},
		}
		filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.credential_injector", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(injector)}})
	}
	filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.upstream_codec", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&upstreamcodecv3.UpstreamCodec{})}})
	opts := &upstreamhttpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &corev3.Http1ProtocolOptions{}}}},
		HttpFilters: filters,
	}
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{upstreamOptionsKey: mustAny(opts)}
}

// upstreamOptionsKey is where a cluster keeps its upstream HTTP options (and so its upstream filters).
const upstreamOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// upstreamOptions decodes a cluster's upstream HTTP options; nil when it has none.
func upstreamOptions(c *clusterv3.Cluster) (*upstreamhttpv3.HttpProtocolOptions, error) {
	a, ok := c.GetTypedExtensionProtocolOptions()[upstreamOptionsKey]
	if !ok {
		return nil, nil
	}
	opts := &upstreamhttpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(opts); err != nil {
		return nil, fmt.Errorf("upstream protocol options: %w", err)
	}
	return opts, nil
}

// secretRefs lists the SDS secrets a cluster's credential injector reads.
func secretRefs(c *clusterv3.Cluster) []string {
	opts, err := upstreamOptions(c)
	if err != nil || opts == nil {
		return nil
	}
	var out []string
	for _, f := range opts.GetHttpFilters() {
		var inj credinjectorv3.CredentialInjector
		var gen genericv3.Generic
		if f.GetTypedConfig().UnmarshalTo(&inj) == nil && inj.GetCredential().GetTypedConfig().UnmarshalTo(&gen) == nil {
			out = append(out, gen.GetCredential().GetName())
		}
	}
	return out
}
