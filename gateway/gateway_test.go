package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/rollout"
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

// The graph is wired, not just built: a rollout's share moving (here by an operator's promote) pushes a new xDS
// snapshot, whose gRPC routes' weights follow the share. The candidate's compatibility check talks only to
// stand-in engines of the test's own.
func TestRolloutShareChangePushesXDS(t *testing.T) {
	raw, err := os.ReadFile("../examples/rollout/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	for _, port := range []string{"18201", "18202", "18211", "18212"} {
		engine := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(engine.Close)
		text = strings.ReplaceAll(text, "127.0.0.1:"+port, strings.TrimPrefix(engine.URL, "http://"))
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := Build(ctx, Config{PolicyPath: path, RolloutInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	before := g.XDS.Version()
	if _, err := g.Rollouts.Command(ctx, "chat-8b", rollout.Promote); err != nil {
		t.Fatal(err)
	}
	if got := g.Rollouts.Share("chat-8b"); got != 1 {
		t.Fatalf("share %v after promote, want 1", got)
	}
	if after := g.XDS.Version(); after <= before {
		t.Errorf("xDS version %d after the share moved, want above %d: the rollouts are not wired to xDS", after, before)
	}
}
