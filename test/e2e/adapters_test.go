package e2e

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/openai/openai-go/v3"
)

// LoRA adapters are granted per tenant, as models are, through the whole data plane with the openai-go client:
// a tenant granted the base model and one adapter calls that adapter (served under its own name by a replica
// that has it loaded), is refused its sibling with 403, and lists exactly what it may call.
func TestAdaptersPerTenantThroughGateway(t *testing.T) {
	// The static bootstrap routes the quickstart's pools; this policy keeps the llama pool's name and address.
	policy := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses: {h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}}
  models:
  - name: llama-3.3-70b
    aliases: [llama-70b]
    adapters: [llama-sql, llama-legal]
    pools:
    - {name: llama70b-h200, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:18101"]}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: [llama-70b, llama-sql]}
`
	fleet := `timeScale: 0.25
replicas:
- {name: llama70b-h200-0, addr: "127.0.0.1:18101", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200, numGPUBlocks: 2048, maxNumSeqs: 64, loras: [llama-sql, llama-legal]}
`
	dir := stackFiles(t, map[string]string{"envoy.yaml": "repo:deploy/envoy/envoy.yaml", "policy.yaml": policy, "fleet.yaml": fleet})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	c := client(st, "sk-demo-acme")
	resp, err := c.Chat.Completions.New(ctx, chatParams("llama-sql", "s", "list the tables"))
	if err != nil {
		t.Fatalf("the granted adapter: %v", err)
	}
	if resp.Model != "llama-sql" {
		t.Errorf("served as %q, want the adapter's own name", resp.Model)
	}
	_, err = c.Chat.Completions.New(ctx, chatParams("llama-legal", "s", "u"))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusForbidden {
		t.Errorf("an adapter not granted: %v, want 403", err)
	}
	ids := modelIDs(t, c)
	if !slices.Equal(ids, []string{"llama-3.3-70b", "llama-70b", "llama-sql"}) {
		t.Errorf("models %v", ids)
	}
}
