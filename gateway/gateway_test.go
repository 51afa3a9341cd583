package gateway

import (
	"context"
	"testing"
)

// The graph builds from the quickstart policy without Redis or scraping, pushes its first xDS snapshot, and
// registers its metrics.
func TestBuild(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := Build(ctx, Config{PolicyPath: "../examples/quickstart/policy.yaml", SecretNodes: []string{"envoy-quickstart"}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.ExtProc == nil || g.Quotas != nil || g.Hook == nil || g.XDS.Version() != 1 {
		t.Fatalf("graph %+v (xDS version %d)", g, g.XDS.Version())
	}
	families, err := g.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"infergate_policy_last_reload_success", "go_goroutines"} {
		if !names[want] {
			t.Errorf("metric %s not registered", want)
		}
	}
	if _, err := Build(ctx, Config{PolicyPath: "does-not-exist.yaml"}); err == nil {
		t.Error("a missing policy built")
	}
}
