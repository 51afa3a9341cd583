package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/infergate/infergate/fleetsim"
)

// The quickstart's managed API is the real Together; the demo and its tests point it at the simulated one.
const (
	quickstartProvider = "baseURL: https://api.together.xyz/v1"
	simulatedProvider  = "baseURL: https://127.0.0.1:18443/v1" // examples/quickstart/fleet.yaml's "together"
)

// SimulatedProviderPolicy is the quickstart policy with its managed API pointed at the simulated one, whose
// certificate (written to caDir by Options.ManagedCADir) Envoy is told to trust.
func SimulatedProviderPolicy(policy []byte, caDir string) ([]byte, error) {
	if !bytes.Contains(policy, []byte(quickstartProvider)) {
		return nil, fmt.Errorf("the policy has no %q to point at the simulated provider", quickstartProvider)
	}
	ca := filepath.Join(caDir, "together-ca.pem")
	return bytes.Replace(policy, []byte(quickstartProvider),
		fmt.Appendf(nil, "%s\n      caFile: %s", simulatedProvider, ca), 1), nil
}

// SimulatedProviderKey is the key the simulated provider accepts (examples/quickstart/fleet.yaml).
const SimulatedProviderKey = "demo-together-key"

// PoolDown makes every replica whose name starts with prefix refuse connections (down) or serve again.
func PoolDown(f *fleetsim.Fleet, prefix string, down bool) (int, error) {
	n := 0
	for _, r := range f.Replicas {
		if !strings.HasPrefix(r.Name(), prefix) {
			continue
		}
		if err := r.SetFaults(fleetsim.Faults{Refuse: down}); err != nil {
			return n, fmt.Errorf("replica %s: %w", r.Name(), err)
		}
		n++
	}
	return n, nil
}

// RegionalPolicy puts the quickstart policy's pools in two regions (docs/regions.md): the H200s and qwen in
// us-east, the L40Ss in us-west, 40 ms apart; globex, of the pro tier, is pinned to us-east. A gateway run with
// --region us-east prefers the H200s and fails over to the L40Ss.
func RegionalPolicy(policy []byte) ([]byte, error) {
	out := strings.NewReplacer(
		"  tiers:", "  regions: [{name: us-east, rtt: {us-west: 40ms}}, {name: us-west}]\n  tiers:",
		"      hardwareClass: h200\n", "      hardwareClass: h200\n      region: us-east\n",
		"    - name: llama70b-l40s\n      hardwareClass: l40s-x4\n", "    - name: llama70b-l40s\n      hardwareClass: l40s-x4\n      region: us-west\n",
		"    - name: qwen7b-l40s\n      hardwareClass: l40s\n", "    - name: qwen7b-l40s\n      hardwareClass: l40s\n      region: us-east\n",
		"    tier: pro\n", "    tier: pro\n    residency: [us-east]\n",
	).Replace(string(policy))
	if strings.Count(out, "region: us-") != 3 || !strings.Contains(out, "residency: [us-east]") {
		return nil, fmt.Errorf("the policy is not the quickstart's: its pools could not be put in regions")
	}
	return []byte(out), nil
}
