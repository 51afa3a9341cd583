package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/infergate/infergate/fleetsim"
)

// classPrice is each hardware class's price in USD per GPU-hour (the policy's hardware table).
var classPrice = map[string]float64{"h200": 3.50, "mi300x": 2.50, "l40s": 1.10}

// poolSpec is one pool of the benchmark's fleet: a model on a hardware class, at that pair's simulated speed.
type poolSpec struct {
	model, class string
	speed        fleetsim.Hardware
}

// modelSpec is one model of the fleet with its SLO and its managed API's price and speed.
type modelSpec struct {
	name                   string
	ttft, tpot             time.Duration
	managedIn, managedOut  float64 // USD per 1M tokens
	managedLatency, perTok time.Duration
}

var models = []modelSpec{
	{name: "qwen-7b", ttft: 500 * time.Millisecond, tpot: 30 * time.Millisecond, managedIn: 0.20, managedOut: 0.20,
		managedLatency: 250 * time.Millisecond, perTok: 12 * time.Millisecond},
	{name: "qwen-32b", ttft: 800 * time.Millisecond, tpot: 40 * time.Millisecond, managedIn: 0.80, managedOut: 0.80,
		managedLatency: 300 * time.Millisecond, perTok: 18 * time.Millisecond},
	{name: "llama-70b", ttft: time.Second, tpot: 50 * time.Millisecond, managedIn: 0.88, managedOut: 0.88,
		managedLatency: 350 * time.Millisecond, perTok: 22 * time.Millisecond},
}

// pools: every model on two hardware classes. The 70B figures are fleetsim's profiles (FP8); the smaller
// models prefill and decode faster in proportion to their size, the L40S least of all for memory bandwidth.
var pools = []poolSpec{
	{"qwen-7b", "l40s", fleetsim.Hardware{PrefillTokensPerSecond: 40000, DecodeStep: 12 * time.Millisecond, DecodeStepPerSeq: 100 * time.Microsecond, StepOverhead: time.Millisecond}},
	{"qwen-7b", "h200", fleetsim.Hardware{PrefillTokensPerSecond: 150000, DecodeStep: 6 * time.Millisecond, DecodeStepPerSeq: 40 * time.Microsecond, StepOverhead: time.Millisecond}},
	{"qwen-32b", "mi300x", fleetsim.Hardware{PrefillTokensPerSecond: 60000, DecodeStep: 12 * time.Millisecond, DecodeStepPerSeq: 60 * time.Microsecond, StepOverhead: 1500 * time.Microsecond}},
	{"qwen-32b", "h200", fleetsim.Hardware{PrefillTokensPerSecond: 70000, DecodeStep: 11 * time.Millisecond, DecodeStepPerSeq: 50 * time.Microsecond, StepOverhead: time.Millisecond}},
	{"llama-70b", "h200", fleetsim.Profiles["h200"]},
	{"llama-70b", "mi300x", fleetsim.Profiles["mi300x"]},
}

const (
	replicasPerPool = 2
	maxNumSeqs      = 16
	numGPUBlocks    = 6000
	meanPrompt      = 1250.0 // tokens: 500-2000
	meanOutput      = 275.0  // tokens: 50-500
)

// decodeTPS is a pool's decode throughput at a full batch, the policy's decodeTokensPerSecond.
func decodeTPS(h fleetsim.Hardware) float64 {
	step := h.StepOverhead + h.DecodeStep + time.Duration(maxNumSeqs)*h.DecodeStepPerSeq
	return maxNumSeqs / step.Seconds()
}

// capacity is a pool replica's requests per second at a full batch: maxNumSeqs requests, each decoding
// meanOutput tokens at the full-batch step and prefilling meanPrompt tokens.
func capacity(h fleetsim.Hardware) float64 {
	perRequest := meanOutput/decodeTPS(h) + meanPrompt/h.PrefillTokensPerSecond
	return 1 / perRequest
}

// policyYAML is the benchmark's policy: the pools with their speeds and prices, one tier with each model's
// SLO, and a managed fallback per model; placement and the fallback's conditions vary by row.
// With queue, spec.admission is on: the gateway holds what no endpoint can take, or serve in time, for room.
func policyYAML(endpoints map[string][]string, managed map[string]string, placement, when string, queue bool) string {
	var b strings.Builder
	b.WriteString("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec:\n  gateway: {maxEndpointsPerDecision: 1}\n")
	if queue {
		b.WriteString("  admission: {}\n")
	}
	fmt.Fprintf(&b, "  routing: {placement: %s, maxWaiting: 8}\n  hardwareClasses:\n", placement)
	for _, c := range []string{"h200", "mi300x", "l40s"} {
		p := fleetsim.Profiles[c]
		fmt.Fprintf(&b, "    %s: {costPerHour: %.2f, prefillTokensPerSecond: %.0f, decodeTokensPerSecond: %.0f}\n", c, classPrice[c], p.PrefillTokensPerSecond, decodeTPS(p))
	}
	b.WriteString("  tiers:\n    interactive:\n      slo:\n        ttft: 1s\n        tpot: 50ms\n        models:\n")
	for _, m := range models {
		fmt.Fprintf(&b, "        - {model: %s, ttft: %s, tpot: %s}\n", m.name, m.ttft, m.tpot)
	}
	b.WriteString("  models:\n")
	for _, m := range models {
		fmt.Fprintf(&b, "  - name: %s\n    pools:\n", m.name)
		for _, p := range pools {
			if p.model != m.name {
				continue
			}
			fmt.Fprintf(&b, "    - {name: %s-%s, hardwareClass: %s, engine: vllm, maxConcurrency: %d, prefillTokensPerSecond: %.0f, decodeTokensPerSecond: %.0f, endpoints: [%s]}\n",
				m.name, p.class, p.class, maxNumSeqs, p.speed.PrefillTokensPerSecond, decodeTPS(p.speed), quoted(endpoints[m.name+"/"+p.class]))
		}
		if when == "" {
			continue // the fleet alone
		}
		fmt.Fprintf(&b, "    fallbacks:\n    - {name: managed, baseURL: \"https://%s/v1\", model: %s-managed, apiKeyFrom: \"env:KEY\", when: [%s], pricing: {inputPerMTok: %.2f, outputPerMTok: %.2f}}\n",
			managed[m.name], m.name, when, m.managedIn, m.managedOut)
	}
	b.WriteString("  tenants:\n  - {name: t, tier: interactive, apiKeys: [\"sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13\"], models: [\"*\"]}\n")
	return b.String()
}

func quoted(eps []string) string {
	q := make([]string, len(eps))
	for i, e := range eps {
		q[i] = fmt.Sprintf("%q", e)
	}
	return strings.Join(q, ", ")
}
