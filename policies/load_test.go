package policies

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/ from the current output")

// TestInvalidPoliciesGolden checks every broken policy under testdata/invalid against its golden list of
// problems: every problem is reported, at once, with file:line.
func TestInvalidPoliciesGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no invalid fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			_, err := LoadFile(file)
			var inv *InvalidError
			if !errors.As(err, &inv) {
				t.Fatalf("LoadFile(%s) error = %v, want *InvalidError", file, err)
			}
			var b strings.Builder
			for _, p := range inv.Problems {
				if p.Line == 0 {
					t.Errorf("problem without a line: %s", p)
				}
				b.WriteString(p.String() + "\n")
			}
			golden := strings.TrimSuffix(file, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden (run with -update to create): %v", err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("problems differ from %s\n--- got\n%s--- want\n%s", golden, got, want)
			}
		})
	}
}

func TestValidPolicies(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	files = append(files, "../examples/quickstart/policy.yaml")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			snap, err := LoadFile(file)
			if err != nil {
				t.Fatalf("LoadFile(%s): %v", file, err)
			}
			if snap.Version == "" || len(snap.Policy.Spec.Models) == 0 {
				t.Fatalf("empty snapshot: %+v", snap)
			}
		})
	}
}

const basePolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: llama-3.3-70b
    aliases: [llama-70b]
    pools:
    - {name: a, hardwareClass: h200, engine: vllm, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["10.0.0.1:8000"]}
  - name: qwen-7b
    pools:
    - {name: b, hardwareClass: h200, engine: sglang, endpoints: ["10.0.0.2:8000"]}
  tenants:
  - name: all
    apiKeys: ["` + "sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13" + `"]
    models: ["*"]
  - name: one
    apiKeys: ["` + "sha256:bbb8fab5ab2c83254e4969c119cdbb68880ee066c42a36223f8ac83fff2d5b96" + `"]
    models: [llama-70b]
`

func TestSnapshotLookups(t *testing.T) {
	snap, err := Parse("base.yaml", []byte(basePolicy))
	if err != nil {
		t.Fatal(err)
	}
	llama, _ := snap.Model("llama-3.3-70b")
	qwen, _ := snap.Model("qwen-7b")
	all, okAll := snap.TenantForKey("sk-demo-acme")
	one, okOne := snap.TenantForKey("sk-demo-globex")
	if !okAll || !okOne || all.Name != "all" || one.Name != "one" {
		t.Fatalf("tenant lookup by key failed: %v %v", all, one)
	}
	if _, ok := snap.TenantForKey("sk-unknown"); ok {
		t.Fatal("unknown key matched a tenant")
	}
	tests := []struct {
		name   string
		tenant *Tenant
		model  string
		exists bool
		allow  bool
	}{
		{"canonical name", all, "llama-3.3-70b", true, true},
		{"alias resolves", all, "llama-70b", true, true},
		{"wildcard tenant", all, "qwen-7b", true, true},
		{"listed by alias", one, "llama-3.3-70b", true, true},
		{"not listed", one, "qwen-7b", true, false},
		{"unknown model", all, "gpt-4", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := snap.Model(tc.model)
			if ok != tc.exists {
				t.Fatalf("Model(%q) exists = %v, want %v", tc.model, ok, tc.exists)
			}
			if ok && snap.Allows(tc.tenant, m) != tc.allow {
				t.Fatalf("Allows(%s, %s) = %v, want %v", tc.tenant.Name, m.Name, !tc.allow, tc.allow)
			}
		})
	}
	if got := snap.NamesFor(one); !slices.Equal(got, []string{llama.Name, "llama-70b"}) {
		t.Errorf("NamesFor(one) = %v", got)
	}
	if got := snap.NamesFor(all); !slices.Equal(got, []string{llama.Name, "llama-70b", qwen.Name}) {
		t.Errorf("NamesFor(all) = %v", got)
	}
	if qwen.Pools[0].ServedModel != "qwen-7b" {
		t.Errorf("servedModel default = %q, want the model name", qwen.Pools[0].ServedModel)
	}
	g := snap.Gateway()
	if g.MaxRequestBodyBytes != DefaultMaxRequestBodyBytes || g.MaxEndpointsPerDecision != DefaultMaxEndpointsPerDecision {
		t.Errorf("gateway defaults not applied: %+v", g)
	}
}

func TestJSONSchemaIsStrict(t *testing.T) {
	b, err := JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{`"additionalProperties": false`, `"hardwareClasses"`, `"apiKeyFrom"`, `"servedModel"`} {
		if !strings.Contains(s, want) {
			t.Errorf("schema lacks %s", want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, glob := range []string{"testdata/valid/*.yaml", "testdata/invalid/*.yaml"} {
		files, _ := filepath.Glob(glob)
		for _, file := range files {
			b, _ := os.ReadFile(file)
			f.Add(b)
		}
	}
	f.Add([]byte(basePolicy))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := Parse("fuzz.yaml", data)
		if err == nil && snap == nil {
			t.Fatal("nil snapshot without error")
		}
		var inv *InvalidError
		if err != nil && !errors.As(err, &inv) {
			t.Fatalf("error of unexpected type %T: %v", err, err)
		}
		if inv != nil && len(inv.Problems) == 0 {
			t.Fatal("InvalidError without problems")
		}
	})
}

// A hostile or broken policy file — nested far too deep, or far too large — is refused with a problem, never
// a crash.
func TestParseBoundsHostileInput(t *testing.T) {
	for name, data := range map[string]string{
		"deep flow":  "spec: " + strings.Repeat("[", 200_000),
		"deep block": "spec:\n" + deepBlock(20_000),
		"huge":       "# " + strings.Repeat("x", MaxPolicyBytes),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("hostile.yaml", []byte(data))
			var inv *InvalidError
			if !errors.As(err, &inv) || len(inv.Problems) == 0 {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func deepBlock(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(strings.Repeat(" ", i%200))
		b.WriteString("- \n")
	}
	return b.String()
}
