package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/capacity"
)

func TestPlanCommand(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(bad, []byte("models:\n- model: llama-3.3-70b\n  architecture: {preset: gpt-5}\n  requestsPerSecond: 1\n  inputTokens: {mean: 10}\n  outputTokens: {mean: 10}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--policy", "../../examples/capacity/policy.yaml", "--workload", "../../examples/capacity/workload.yaml"}, 0, "llama-h100 does not fit"},
		{[]string{"--policy", "../../examples/quickstart/policy.yaml", "--workload", "../../examples/quickstart/workload.yaml"}, 0, "llama70b-l40s  l40s-x4  4"},
		{[]string{"--policy", "../../examples/capacity/policy.yaml"}, 2, "--workload"},
		{[]string{"--policy", "../../examples/capacity/policy.yaml", "--workload", bad}, 1, `unknown preset "gpt-5"`},
		{[]string{"--live", "127.0.0.1:1", "--interval", "1ms"}, 1, "--live"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"plan"}, tc.args...), &out, &errOut)
		if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.out) {
			t.Errorf("plan %v: exit %d, want %d with %q\n%s%s", tc.args, code, tc.code, tc.out, out.String(), errOut.String())
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"plan", "--json", "--policy", "../../examples/capacity/policy.yaml", "--workload",
		"../../examples/capacity/workload.yaml"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("--json: exit %d", code)
	}
	var plans []capacity.ModelPlan
	if err := json.Unmarshal(out.Bytes(), &plans); err != nil || len(plans) != 2 || plans[0].Cheapest == "" {
		t.Fatalf("--json: %v %+v", err, plans)
	}
}
