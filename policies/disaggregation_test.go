package policies

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// docs/disaggregation.md's policy is one validation and the JSON Schema both accept, with its roles read.
func TestDisaggregationDocExampleLoads(t *testing.T) {
	doc, err := os.ReadFile("../docs/disaggregation.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## The policy\n\n```yaml\n")
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed || !strings.Contains(block, "disaggregation:") {
		t.Fatal("docs/disaggregation.md lost its policy example")
	}
	policy := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    l40s-x2: {gpu: l40s, gpusPerReplica: 2, costPerHour: 2.2, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  ` + strings.ReplaceAll(strings.TrimSuffix(block, "\n"), "\n", "\n  ") + `
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`
	snap, err := Parse("disaggregation.md", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("llama-3.3-70b")
	if m.Disaggregation == nil || m.Disaggregation.KVBytesPerToken != 163840 || m.Pools[0].ServesWhole() || !m.Pools[0].Prefills() ||
		!m.Pools[1].ServesWhole() || m.Pools[1].Prefills() {
		t.Fatalf("model %+v", m)
	}
	if err := schemaAccepts(t, compiledSchema(t), []byte(policy)); err != nil {
		t.Errorf("the JSON Schema refuses it: %v", err)
	}
}

// resolverMap is an EndpointResolver from a map.
type resolverMap map[ServiceRef][]string

func (r resolverMap) Endpoints(ref ServiceRef) []string { return r[ref] }

// A decode pool discovered from a Service finds its replicas' engines on service.enginePort, paired by address;
// the watcher is asked for both ports.
func TestDiscoveredEnginesPairByAddress(t *testing.T) {
	policy := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: m
    pools:
    - {name: p, hardwareClass: h200, engine: vllm, role: prefill, endpoints: ["10.0.9.1:8000"]}
    - {name: d, hardwareClass: h200, engine: vllm, role: decode, service: {namespace: llm, name: decode, port: http, enginePort: vllm}}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`
	sidecars := ServiceRef{Namespace: "llm", Name: "decode", Port: "http"}
	engines := ServiceRef{Namespace: "llm", Name: "decode", Port: "vllm"}
	snap, err := ParseResolved("p.yaml", []byte(policy), resolverMap{
		sidecars: {"10.0.1.2:8000", "10.0.1.1:8000"},
		engines:  {"10.0.1.1:8001", "10.0.1.7:8001"}, // 10.0.1.2 lists none; 10.0.1.7 is no replica
	})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	d := &m.Pools[1]
	if got := d.EngineEndpoint("10.0.1.1:8000"); got != "10.0.1.1:8001" {
		t.Errorf("engine of 10.0.1.1:8000: %q", got)
	}
	if got := d.EngineEndpoint("10.0.1.2:8000"); got != "" {
		t.Errorf("engine of 10.0.1.2:8000, whose slice lists none: %q", got)
	}
	if refs := snap.Services(); len(refs) != 2 || !slices.Contains(refs, sidecars) || !slices.Contains(refs, engines) {
		t.Errorf("watched: %v", refs)
	}
}
