package main

import (
	"fmt"
	"strings"
)

// apiKeyHash is the sha256 of the benchmark tenant's key (the key itself is never sent: requests go straight
// to the picker).
const apiKeyHash = "sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"

// policyYAML is the scenario's policy: its classes with their prices and speeds, a pool per class, one tier
// with the model's SLO, no managed API; placement varies by row, and queue turns spec.admission on.
func (s *scenario) policyYAML(endpoints [][]string, placement string, queue bool) string {
	var b strings.Builder
	b.WriteString("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec:\n  gateway: {maxEndpointsPerDecision: 1}\n")
	if queue {
		b.WriteString("  admission: {}\n")
	}
	fmt.Fprintf(&b, "  routing: {placement: %s, maxWaiting: 8}\n  hardwareClasses:\n", placement)
	for i, c := range s.classes {
		stated := s.statedSpeed(i)
		fmt.Fprintf(&b, "    %s: {costPerHour: %.4f, prefillTokensPerSecond: %.0f, decodeTokensPerSecond: %.0f}\n", c.name, c.price,
			c.speed.PrefillTokensPerSecond*stated, decodeTPS(c)*stated)
	}
	fmt.Fprintf(&b, "  tiers:\n    interactive:\n      slo: {ttft: %s, tpot: %s}\n", s.ttft, s.tpot)
	fmt.Fprintf(&b, "  models:\n  - name: %s\n    pools:\n", s.model)
	for i, c := range s.classes {
		q := make([]string, len(endpoints[i]))
		for j, e := range endpoints[i] {
			q[j] = fmt.Sprintf("%q", e)
		}
		fmt.Fprintf(&b, "    - {name: %s, hardwareClass: %s, engine: vllm, maxConcurrency: %d, endpoints: [%s]}\n", c.name, c.name,
			c.maxNumSeqs, strings.Join(q, ", "))
	}
	fmt.Fprintf(&b, "  tenants:\n  - {name: t, tier: interactive, apiKeys: [%q], models: [\"*\"]}\n", apiKeyHash)
	return b.String()
}

// statedSpeed is how many times its real speeds the policy states class i's (see -misstate): misstate for
// the even classes, its inverse for the odd, 1 when unset.
func (s *scenario) statedSpeed(i int) float64 {
	if s.misstate <= 0 || s.misstate == 1 {
		return 1
	}
	if i%2 == 1 {
		return 1 / s.misstate
	}
	return s.misstate
}
