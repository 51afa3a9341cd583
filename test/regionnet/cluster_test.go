package regionnet

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Two regions over a real network (namespaces, veth, Toxiproxy at 50 ms): the home region's engines go down
// and come back, then the home region is cut off from the other, then its infergate is killed (its Envoy's
// ext_proc fails over to the other region's, which places the requests at home). Nothing is lost beyond what only the cut
// region could serve, nothing is served outside a tenant's residency, the failover is under two seconds (Envoy's
// retry priority moves the first requests, the picker the rest), and the traffic comes back once, after the
// failback. A tenant's requestsPerSecond limit holds in every window across both regions on one Redis, and while
// the region without Redis is cut off it admits only its share on its own. make chaos-regions runs every
// scenario on three regions.
func TestRegionsFailOverOverARealNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root (CI runs as root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := Supported(ctx); err != nil {
		t.Fatalf("network namespaces: %v", err)
	}
	dir := t.TempDir()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bins := map[string]string{}
	for _, pkg := range []string{"./cmd/infergate", "./cmd/infergate-sim", "./test/regionnet/edge"} {
		bins[pkg] = filepath.Join(dir, filepath.Base(pkg))
		// -race as make test builds every package: the build reuses them instead of compiling the whole tree a
		// second time (two minutes of a cold run on two cores).
		cmd := exec.CommandContext(ctx, "go", "build", "-race", "-o", bins[pkg], pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	c, err := Start(ctx, Options{Infergate: bins["./cmd/infergate"], Sim: bins["./cmd/infergate-sim"], Edge: bins["./test/regionnet/edge"],
		Root: root, Dir: dir, Regions: []string{"us-east", "eu-west"}, RTT: map[string]time.Duration{"us-east/eu-west": 50 * time.Millisecond},
		Failback: 2 * time.Second, MeteredRPS: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	phases := Phases{Warm: 2 * time.Second, Outage: 4 * time.Second, Recovery: 7 * time.Second, Interval: 50 * time.Millisecond}
	for _, s := range Scenarios() {
		if s.Name != "region-down" && s.Name != "partition" && s.Name != "gateway-down" {
			continue
		}
		f, err := c.Run(ctx, s, phases, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		f.Report(&out)
		t.Logf("%s:\n%s", s.Name, out.String())
		for _, v := range f.Verdicts() {
			if !v.Met {
				t.Errorf("%s: %s: not met", s.Name, v.Target)
			}
		}
		if s.Name == "region-down" && (f.Elsewhere["eu-west"] == 0 || f.Refusals["residency_unavailable to us-east as pinned-us-east"] == 0) {
			t.Errorf("region-down: us-east's requests went to %v, refusals %v: want eu-west, and the pinned tenant refused", f.Elsewhere, f.Refusals)
		}
		if s.Name == "gateway-down" {
			if n := placedFrom(t, c, "eu-west", "us-east"); n == 0 {
				t.Error("gateway-down: eu-west's gateway placed no request of us-east's Envoy at home")
			}
		}
	}
}

// placedFrom is how many requests region's gateway placed for the Envoy of region from, in from's own pools
// (infergate_region_requests_total{from, to: from}).
func placedFrom(t *testing.T, c *Cluster, region, from string) float64 {
	t.Helper()
	resp, err := http.Get(c.MetricsURL(region))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, m := range fams["infergate_region_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["from"] == from && labels["to"] == from {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}
