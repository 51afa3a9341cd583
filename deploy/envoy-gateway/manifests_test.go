package envoygateway_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/manifest"
	"github.com/infergate/infergate/xds"
)

// These tests decode the manifests into Envoy Gateway's and the Gateway API's Kubernetes types. They run
// without the race detector (make test), which would otherwise recompile the Kubernetes libraries for nothing.

// Every document of deploy/envoy-gateway decodes into Envoy Gateway's and the Gateway API's own types, and
// they agree with each other, with the quickstart policy and with infergate's Kubernetes Service.
func TestEnvoyGatewayManifests(t *testing.T) {
	var (
		eg     egv1a1.EnvoyGateway
		gw     gwapiv1.Gateway
		policy egv1a1.EnvoyExtensionPolicy
		be     egv1a1.Backend
		route  gwapiv1.HTTPRoute
		proxy  egv1a1.EnvoyProxy
		btls   gwapiv1.BackendTLSPolicy
	)
	into := map[string]any{"EnvoyGateway": &eg, "Gateway": &gw, "EnvoyExtensionPolicy": &policy, "Backend": &be, "HTTPRoute": &route,
		"EnvoyProxy": &proxy, "BackendTLSPolicy": &btls}
	seen := map[string]bool{}
	for _, doc := range manifest.DecodeAll(t, "infergate.yaml") {
		kind, _ := doc["kind"].(string)
		target, ok := into[kind]
		if !ok {
			t.Fatalf("unexpected kind %q", kind)
		}
		manifest.StrictDecode(t, doc, target)
		seen[kind] = true
	}
	if len(seen) != len(into) {
		t.Fatalf("kinds decoded: %v", seen)
	}

	// The extension manager calls infergate's hook after translation, with everything it translated.
	em := eg.ExtensionManager
	if em == nil || em.Hooks == nil || em.Hooks.XDSTranslator == nil || !slices.Contains(em.Hooks.XDSTranslator.Post, egv1a1.XDSTranslation) {
		t.Fatal("extensionManager must hook the post-translation step")
	}
	tr := em.Hooks.XDSTranslator.Translation
	for name, c := range map[string]*bool{"cluster": tr.Cluster.IncludeAll, "route": tr.Route.IncludeAll, "secret": tr.Secret.IncludeAll} {
		if c == nil || !*c {
			t.Errorf("translation.%s.includeAll must be true: the hook edits them", name)
		}
	}
	hookPort := strings.TrimPrefix(xds.EnvoyGatewayHookAddr, ":")
	if em.Service == nil || em.Service.FQDN == nil || strconv.Itoa(int(em.Service.FQDN.Port)) != hookPort {
		t.Errorf("extension service %+v, want port %s", em.Service, hookPort)
	}

	// Mutual TLS everywhere infergate is reached: the hook (its answers carry the managed-API keys) and ext_proc.
	if tls := em.Service.TLS; tls == nil || tls.ClientCertificateRef == nil || tls.CertificateRef.Name == "" {
		t.Errorf("the extension manager must call the hook over mTLS: %+v", em.Service.TLS)
	}
	if ref := gw.Spec.Infrastructure; ref == nil || ref.ParametersRef == nil || ref.ParametersRef.Name != proxy.Name {
		t.Errorf("the Gateway must use the EnvoyProxy %s", proxy.Name)
	}
	if proxy.Spec.BackendTLS == nil || proxy.Spec.BackendTLS.ClientCertificateRef == nil {
		t.Error("the proxies need a client certificate for infergate's ext_proc")
	}
	if len(btls.Spec.TargetRefs) != 1 || btls.Spec.TargetRefs[0].Name != "infergate" || btls.Spec.TargetRefs[0].SectionName == nil ||
		*btls.Spec.TargetRefs[0].SectionName != "grpc-extproc" || len(btls.Spec.Validation.CACertificateRefs) != 1 {
		t.Errorf("BackendTLSPolicy %+v must verify infergate's ext_proc port", btls.Spec)
	}

	// The ext_proc policy: on the Gateway, to infergate's ext_proc port, full-duplex, envoy.lb writable.
	if len(policy.Spec.TargetRefs) != 1 || string(policy.Spec.TargetRefs[0].Name) != gw.Name || policy.Spec.TargetRefs[0].Kind != "Gateway" {
		t.Errorf("policy targets %+v, want Gateway %s", policy.Spec.TargetRefs, gw.Name)
	}
	if len(policy.Spec.ExtProc) != 1 {
		t.Fatalf("extProc %+v", policy.Spec.ExtProc)
	}
	ep := policy.Spec.ExtProc[0]
	ref := ep.BackendRefs[0]
	if ref.Name != "infergate" || ref.Port == nil || *ref.Port != 9002 {
		t.Errorf("ext_proc backend %+v, want the infergate Service on 9002", ref)
	}
	if ep.ProcessingMode == nil || *ep.ProcessingMode.Request.Body != egv1a1.FullDuplexStreamedExtBodyProcessingMode ||
		*ep.ProcessingMode.Response.Body != egv1a1.FullDuplexStreamedExtBodyProcessingMode {
		t.Errorf("processing mode %+v", ep.ProcessingMode)
	}
	if ep.Metadata == nil || !slices.Contains(ep.Metadata.WritableNamespaces, "envoy.lb") {
		t.Error("infergate must be allowed to write the envoy.lb metadata (x-gateway-destination-endpoint)")
	}

	// infergate's Service exposes both ports.
	ports := map[float64]bool{}
	for _, doc := range manifest.DecodeAll(t, "../kubernetes/infergate.yaml") {
		if doc["kind"] == "Service" {
			for _, p := range manifest.Get(doc, "spec", "ports").([]any) {
				ports[float64(p.(map[string]any)["port"].(int))] = true
			}
		}
	}
	for _, p := range []float64{9002, 18002} {
		if !ports[p] {
			t.Errorf("the infergate Service lacks port %v", p)
		}
	}

	// The HTTPRoute hangs on the Gateway and has a rule for every pool and fallback of the policy.
	if len(route.Spec.ParentRefs) != 1 || string(route.Spec.ParentRefs[0].Name) != gw.Name {
		t.Errorf("HTTPRoute parents %+v", route.Spec.ParentRefs)
	}
	snap, err := policies.LoadFile("../../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, rule := range route.Spec.Rules {
		for _, m := range rule.Matches {
			var model, pool string
			for _, h := range m.Headers {
				switch strings.ToLower(string(h.Name)) {
				case "x-infergate-pool":
					pool = h.Value
				case "x-infergate-model":
					model = h.Value
				}
			}
			name := xds.ClusterForPoolHeader(snap, model, pool)
			if name == "" {
				t.Errorf("rule %+v matches no pool of the policy", m)
			}
			covered[name] = true
		}
		if len(rule.BackendRefs) != 1 || string(rule.BackendRefs[0].Name) != be.Name {
			t.Errorf("rule backends %+v, want the %s placeholder", rule.BackendRefs, be.Name)
		}
	}
	for _, m := range snap.Policy.Spec.Models {
		for _, p := range m.Pools {
			if !covered[xds.ClusterForPoolHeader(snap, m.Name, p.Name)] {
				t.Errorf("no HTTPRoute rule for pool %s", p.Name)
			}
		}
		for _, f := range m.Fallbacks {
			if !covered[contract.FallbackClusterName(m.Name, f.Name)] {
				t.Errorf("no HTTPRoute rule for fallback %s", f.Name)
			}
		}
	}
}
