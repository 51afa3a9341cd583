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
