package contract

import "testing"

func TestPoolValues(t *testing.T) {
	if name, fb := ParsePool(FallbackPool("together")); !fb || name != "together" {
		t.Errorf("ParsePool(FallbackPool) = %q %v", name, fb)
	}
	if name, fb := ParsePool("h200"); fb || name != "h200" {
		t.Errorf("ParsePool(pool) = %q %v", name, fb)
	}
	for name, want := range map[string]bool{"x-gateway-destination-endpoint": true, "x-infergate-pool": true,
		"x-infergate-anything": true, "x-request-id": false, "authorization": false, "x-gatewayish": false} {
		if got := Reserved(name); got != want {
			t.Errorf("Reserved(%q) = %v", name, got)
		}
	}
	names := map[string]bool{}
	for _, n := range []string{ClusterName("m", "p"), FallbackClusterName("m", "p"), FailoverClusterName("m", "p"),
		SecretName("m", "p")} {
		if names[n] {
			t.Errorf("name %q built twice", n)
		}
		names[n] = true
	}
}
