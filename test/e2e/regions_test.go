package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// regionalQuickstart is the quickstart policy in two regions (RegionalPolicy).
func regionalQuickstart(t *testing.T) string {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "examples/quickstart/policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := RegionalPolicy(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// regionSeries says whether a series or query reads the regions' series, which a gateway exports only with a
// region (TestRegionSeriesAreExported).
func regionSeries(nameOrExpr string) bool {
	return strings.Contains(nameOrExpr, "infergate_region_")
}

// A gateway with a region exports every region series the shipped dashboard and rules read, once it has routed a
// request.
func TestRegionSeriesAreExported(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := stackFiles(t, map[string]string{"policy.yaml": regionalQuickstart(t), "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml",
		"fleet.yaml": "repo:examples/quickstart/fleet.yaml"})
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", FreePorts: true,
		Region: "us-east"})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := sendDisagg(t, st.URL, "hello"); status != http.StatusOK {
		t.Fatalf("%d %.300s", status, body)
	}
	want := queriedSeries(t, regionSeries)
	if len(want) == 0 {
		t.Fatal("the dashboard and rules read no region series")
	}
	if missing := unexported(t, st, want); len(missing) > 0 {
		t.Errorf("queried but not exported after a routed request: %v", missing)
	}
}
