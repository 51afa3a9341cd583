package capacity

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/policies"
)

func planFiles(t *testing.T, policy, workload string) []ModelPlan {
	t.Helper()
	snap, err := policies.LoadFile(policy)
	if err != nil {
		t.Fatal(err)
	}
	w, archs, err := LoadWorkload(workload)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := Plan(snap, w, archs)
	if err != nil {
		t.Fatal(err)
	}
	return plans
}

func pool(t *testing.T, plans []ModelPlan, model, name string) PoolPlan {
	t.Helper()
	for _, mp := range plans {
		for _, p := range mp.Pools {
			if mp.Model == model && p.Pool == name {
				return p
			}
		}
	}
	t.Fatalf("no plan for %s/%s", model, name)
	return PoolPlan{}
}

func TestPlanTheShippedExample(t *testing.T) {
	plans := planFiles(t, "../examples/capacity/policy.yaml", "../examples/capacity/workload.yaml")
	if h100 := pool(t, plans, "llama-3.3-70b", "llama-h100"); h100.Fits || !strings.Contains(h100.Why, "fewer than the 32768-token context") {
		t.Errorf("70B FP8 on one H100: fits %v, %q", h100.Fits, h100.Why)
	}
	for _, mp := range plans {
		if mp.Cheapest == "" || mp.Managed == nil || mp.Managed.Never || mp.Managed.CrossoverRequestsPerSecond <= 0 {
			t.Errorf("%s: cheapest %q, managed %+v", mp.Model, mp.Cheapest, mp.Managed)
		}
		for _, p := range mp.Pools {
			if !p.Fits {
				continue
			}
			if p.Replicas < MinWarmPool || p.Batch < 1 || p.Batch > p.MaxSequences || p.TPOT > mp.TPOT || p.TTFTP95 > mp.TTFT {
				t.Errorf("%s/%s: %+v", mp.Model, p.Pool, p)
			}
			// Capacity covers the load with the headroom kept free.
			if float64(p.Replicas)*p.RequestsPerSecondPerReplica*(1-0.2) < mp.RequestsPerSecond*0.999 {
				t.Errorf("%s/%s: %d replicas × %.2f req/s do not carry %v req/s", mp.Model, p.Pool, p.Replicas, p.RequestsPerSecondPerReplica, mp.RequestsPerSecond)
			}
			// A higher hit rate never needs more replicas.
			last := 1 << 30
			for _, h := range p.ByHitRate {
				if !h.Fits {
					continue
				}
				if h.Replicas > last {
					t.Errorf("%s/%s: %d replicas at hit rate %v, more than at a lower one", mp.Model, p.Pool, h.Replicas, h.HitRate)
				}
				last = h.Replicas
			}
		}
	}
	var table, js bytes.Buffer
	Render(&table, plans)
	for _, want := range []string{"llama-h100 does not fit", "replicas by prefix-cache hit rate", "self-hosting costs less above"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, table.String())
		}
	}
	if err := json.NewEncoder(&js).Encode(plans); err != nil {
		t.Fatal(err)
	}
	var back []ModelPlan
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back) != len(plans) || back[0].Pools[1].Replicas != plans[0].Pools[1].Replicas {
		t.Errorf("JSON does not round-trip: %v", err)
	}
}

func TestPlanTheQuickstart(t *testing.T) {
	plans := planFiles(t, "../examples/quickstart/policy.yaml", "../examples/quickstart/workload.yaml")
	// The 70B in FP8 does not fit one L40S; the quickstart runs it on four a replica (l40s-x4), where it does.
	if l40s := pool(t, plans, "llama-3.3-70b", "llama70b-l40s"); !l40s.Fits || l40s.GPUsPerReplica != 4 || l40s.Replicas < 2 {
		t.Errorf("70B on four L40S: %+v", l40s)
	}
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	one := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(one, []byte(strings.Replace(string(src), "hardwareClass: l40s-x4", "hardwareClass: l40s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	plans = planFiles(t, one, "../examples/quickstart/workload.yaml")
	if l40s := pool(t, plans, "llama-3.3-70b", "llama70b-l40s"); l40s.Fits || !strings.Contains(l40s.Why, "nothing is left for KV cache") {
		t.Errorf("70B on one L40S: fits %v, %q", l40s.Fits, l40s.Why)
	}
	if h200 := pool(t, plans, "llama-3.3-70b", "llama70b-h200"); !h200.Fits || h200.Replicas < 2 {
		t.Errorf("70B on one H200: %+v", h200)
	}
}

// The managed API wins below the warm pool's worth of traffic, and at any load when a replica costs more
// than the requests it serves would on the managed API.
func TestManagedCrossover(t *testing.T) {
	plans := planFiles(t, "../examples/capacity/policy.yaml", "../examples/capacity/workload.yaml")
	mp := plans[0]
	best := pool(t, plans, mp.Model, mp.Cheapest)
	perRequest := (2000*0.88 + 300*0.88) / 1e6
	want := 2 * 4.98 / (3600 * perRequest)
	within(t, "crossover req/s", mp.Managed.CrossoverRequestsPerSecond, want, 0.001)
	if best.HardwareClass != "h100x2" {
		t.Errorf("cheapest %s", best.HardwareClass)
	}
}

func TestWorkloadProblemsHaveLines(t *testing.T) {
	src := `models:
- model: m
  architecture: {preset: llama-3.1-8b}
  weights: fp4
  requestsPerSecond: 0
  inputTokens: {mean: 100, p95: 50}
  outputTokens: {mean: 10}
  prefixHitRate: 1.5
headroom: 1
`
	_, err := ParseWorkload("w.yaml", []byte(src))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"w.yaml:4: models[0].weights", "w.yaml:5: models[0].requestsPerSecond", "w.yaml:6: models[0].inputTokens.p95",
		"w.yaml:8: models[0].prefixHitRate", "w.yaml:9: headroom"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	if _, err := ParseWorkload("w.yaml", []byte("models: []\nbogus: 1\n")); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown field: %v", err)
	}
}

func FuzzParseWorkload(f *testing.F) {
	f.Add([]byte("models:\n- model: m\n  architecture: {preset: llama-3.1-8b}\n  requestsPerSecond: 1\n  inputTokens: {mean: 10}\n  outputTokens: {mean: 10}\n"))
	f.Add([]byte("headroom: 0.5\nmodels: [{model: x}]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ParseWorkload("fuzz", b)
		if err != nil {
			return
		}
		for _, m := range w.Models {
			if m.RequestsPerSecond <= 0 || m.InputTokens.Mean < 1 || m.OutputTokens.P95 < m.OutputTokens.Mean {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}

// A workload or an architecture config that never ends (a device, a pipe) is refused at its bound instead of
// read until the process is killed.
func TestEndlessFilesAreRefusedAtTheirBound(t *testing.T) {
	dir := t.TempDir()
	workload := filepath.Join(dir, "workload.yaml")
	src := "models:\n- model: m\n  architecture: {config: /dev/zero}\n  requestsPerSecond: 1\n  inputTokens: {mean: 10}\n  outputTokens: {mean: 10}\n"
	if err := os.WriteFile(workload, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadWorkload(workload); err == nil || !strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Errorf("config /dev/zero: %v, want refused at its bound", err)
	}
	if _, _, err := LoadWorkload("/dev/zero"); err == nil || !strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Errorf("workload /dev/zero: %v, want refused at its bound", err)
	}
}
