package policies

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/infergate/infergate/fleet"
)

// compiledSchema compiles the policy's JSON Schema with a real validator, as an editor would use it.
func compiledSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	raw, err := JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("policy.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("policy.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// schemaAccepts validates a YAML policy against the schema.
func schemaAccepts(t *testing.T, s *jsonschema.Schema, data []byte) error {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(inst)
}

// The JSON Schema an editor uses and `infergate validate` agree: the quickstart passes both, and each broken
// variant of it fails both.
func TestSchemaAgreesWithValidate(t *testing.T) {
	base, err := os.ReadFile("testdata/valid/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := compiledSchema(t)
	if _, err := Parse("quickstart.yaml", base); err != nil {
		t.Fatalf("validate refuses the quickstart: %v", err)
	}
	if err := schemaAccepts(t, s, base); err != nil {
		t.Fatalf("the schema refuses the quickstart: %v", err)
	}
	const key = "sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"
	cases := []struct{ name, from, to string }{
		{"key digest not hex", key, "sha256:zz" + key[9:]},
		{"key digest short", key, key[:40]},
		{"key without sha256:", key, key[7:]},
		{"endpoint is a host name", `"127.0.0.1:18101"`, `"replica-1:18101"`},
		{"endpoint octet out of range", `"127.0.0.1:18101"`, `"999.0.0.1:18101"`},
		{"endpoint without port", `"127.0.0.1:18101"`, `"127.0.0.1"`},
		{"pool name upper-case", "name: llama70b-h200", "name: Llama70B-H200"},
		{"fallback name with a slash", "name: together", "name: to/gether"},
		{"unknown field", "tenantHeader: true", "tenantHeader: true\n    tenantHeaders: true"},
		{"number as a word", "costPerHour: 3.50", "costPerHour: cheap"},
		{"unknown engine", "engine: vllm", "engine: ollama"},
		{"engine in capitals", "engine: vllm", "engine: VLLM"},
		{"unknown fail mode", "failMode: open", "failMode: sometimes"},
		{"objective beyond 1", "objective: 0.99", "objective: 1.5"},
		{"unknown fallback condition", "when: [saturated, unavailable]", "when: [sometimes]"},
		{"key source not env: or file:", "apiKeyFrom: env:TOGETHER_API_KEY", "apiKeyFrom: vault:together"},
		{"negative price", "inputPerMTok: 0.20", "inputPerMTok: -1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !bytes.Contains(base, []byte(c.from)) {
				t.Fatalf("the quickstart has no %q", c.from)
			}
			broken := []byte(strings.Replace(string(base), c.from, c.to, 1))
			if _, err := Parse("broken.yaml", broken); err == nil {
				t.Error("validate accepts it")
			}
			if err := schemaAccepts(t, s, broken); err == nil {
				t.Error("the schema accepts it")
			}
		})
	}
}

// The schema's engines are fleet's dialect registry, in its order: an editor offers exactly the engines
// validation accepts and the scraper can read.
func TestSchemaEnginesFromRegistry(t *testing.T) {
	raw, err := JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs map[string]struct {
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	got := doc.Defs["Pool"].Properties["engine"].Enum
	if want := fleet.EngineNames(); !slices.Equal(got, want) || len(got) != 3 {
		t.Errorf("schema pools[].engine enum = %v, want %v (vllm, sglang, trtllm)", got, want)
	}
}
