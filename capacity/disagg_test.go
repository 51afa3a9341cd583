package capacity

import (
	"bytes"
	"strings"
	"testing"

	"github.com/infergate/infergate/policies"
)

// disaggPolicy is docs/disaggregation.md's model: prefill on H200s, decode on L40S pairs.
const disaggPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {gpu: h200, costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    l40s-x2: {gpu: l40s, gpusPerReplica: 2, costPerHour: 2.2, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  slo: {ttft: 5s, tpot: 80ms}
  models:
  - name: llama-3.3-70b
    contextTokens: 32768
    pools:
    - {name: prefill-h200, hardwareClass: h200, engine: vllm, role: prefill, endpoints: ["10.0.0.1:8000"]}
    - {name: decode-l40s, hardwareClass: l40s-x2, engine: vllm, role: decode, endpoints: ["10.0.1.1:8000"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

func disaggWorkload(input, output string) string {
	return `models:
- model: llama-3.3-70b
  architecture: {preset: llama-3.3-70b}
  weights: fp8
  kvCache: fp8
  requestsPerSecond: 20
  inputTokens: ` + input + `
  outputTokens: ` + output + `
  prefixHitRate: 0.3
`
}

func planDisagg(t *testing.T, workload string) (ModelPlan, DisaggPlan) {
	t.Helper()
	snap, err := policies.Parse("disagg.yaml", []byte(disaggPolicy))
	if err != nil {
		t.Fatal(err)
	}
	w, err := ParseWorkload("workload.yaml", []byte(workload))
	if err != nil {
		t.Fatal(err)
	}
	plans, err := Plan(snap, w, map[string]Architecture{"llama-3.3-70b": Presets["llama-3.3-70b"]})
	if err != nil {
		t.Fatal(err)
	}
	if len(plans[0].Disaggregated) != 1 {
		t.Fatalf("disaggregated plans: %+v", plans[0].Disaggregated)
	}
	return plans[0], plans[0].Disaggregated[0]
}

// The planner sizes the prefill and the decode pool of a disaggregated model for the load: each carries it
// with the headroom kept, within the targets; and the ratio follows the workload — long prompts with short
// answers need more prefill replicas per decode replica than short prompts with long answers.
func TestPlanSizesPrefillAndDecodePools(t *testing.T) {
	mp, long := planDisagg(t, disaggWorkload("{mean: 12000, p95: 24000}", "{mean: 200, p95: 500}"))
	_, chat := planDisagg(t, disaggWorkload("{mean: 1500, p95: 4000}", "{mean: 600, p95: 1500}"))
	for name, d := range map[string]DisaggPlan{"long prompts": long, "chat": chat} {
		if !d.Fits {
			t.Fatalf("%s: %s", name, d.Why)
		}
		if float64(d.PrefillReplicas)*d.PrefillRequestsPerSecondPerReplica*0.8 < 20*0.999 ||
			float64(d.DecodeReplicas)*d.DecodeRequestsPerSecondPerReplica*0.8 < 20*0.999 {
			t.Errorf("%s: %+v does not carry 20 req/s", name, d)
		}
		if d.TTFTP95 > mp.TTFT || d.TPOT > mp.TPOT || d.TransferP95 <= 0 {
			t.Errorf("%s: TTFT p95 %v, TPOT %v, transfer %v against %v and %v", name, d.TTFTP95, d.TPOT, d.TransferP95, mp.TTFT, mp.TPOT)
		}
	}
	longRatio := float64(long.PrefillReplicas) / float64(long.DecodeReplicas)
	chatRatio := float64(chat.PrefillReplicas) / float64(chat.DecodeReplicas)
	if longRatio <= chatRatio {
		t.Errorf("prefill:decode %d:%d for long prompts, %d:%d for chat: long prompts should need the larger prefill share",
			long.PrefillReplicas, long.DecodeReplicas, chat.PrefillReplicas, chat.DecodeReplicas)
	}
	var out bytes.Buffer
	Render(&out, []ModelPlan{mp})
	if !strings.Contains(out.String(), "disaggregated (prefill pool : decode pool)") || !strings.Contains(out.String(), "prefill-h200") {
		t.Errorf("the table lacks the disaggregated pair:\n%s", out.String())
	}
}
