package policies

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func TestEvalChecks(t *testing.T) {
	paris := "Paris"
	schema := map[string]any{"type": "object", "required": []any{"city"},
		"properties": map[string]any{"city": map[string]any{"type": "string"}, "population": map[string]any{"type": "integer"}}}
	for _, tc := range []struct {
		name   string
		c      EvalCase
		answer string
		want   bool
	}{
		{"exact", EvalCase{Exact: &paris}, "Paris", true},
		{"exact, white space around", EvalCase{Exact: &paris}, "\n Paris \n", true},
		{"exact, more words", EvalCase{Exact: &paris}, "Paris.", false},
		{"exact, empty", EvalCase{Exact: &paris}, "", false},
		{"regex anywhere", EvalCase{Regex: `\b4096\b`}, "It is 4096.", true},
		{"regex, no match", EvalCase{Regex: `\b4096\b`}, "It is 40960.", false},
		{"regex anchored", EvalCase{Regex: `^(?i)yes$`}, "YES", true},
		{"schema", EvalCase{JSONSchema: schema}, ` {"city": "Paris", "population": 2100000} `, true},
		{"schema, wrong type", EvalCase{JSONSchema: schema}, `{"city": "Paris", "population": 2.5}`, false},
		{"schema, missing field", EvalCase{JSONSchema: schema}, `{"population": 1}`, false},
		{"schema, not JSON", EvalCase{JSONSchema: schema}, "```json\n{\"city\": \"Paris\"}\n```", false},
		{"schema, two documents", EvalCase{JSONSchema: schema}, `{"city": "Paris"} {"city": "Rome"}`, false},
		{"webhook: scored in pairs", EvalCase{Webhook: "http://judge/score"}, "anything", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := compileEvalCase(&tc.c)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Check(tc.answer); got != tc.want {
				t.Errorf("Check(%q) = %v, want %v", tc.answer, got, tc.want)
			}
		})
	}
}

// A schema stands alone: a $ref to a file or a URL is refused when the policy loads, never fetched.
func TestEvalSchemaReadsNothing(t *testing.T) {
	for _, ref := range []string{"file:///etc/passwd", "http://127.0.0.1:1/schema.json"} {
		_, err := compileEvalCase(&EvalCase{JSONSchema: map[string]any{"$ref": ref}})
		if err == nil {
			t.Errorf("$ref %s compiled", ref)
		}
	}
}

// The request asks for a deterministic, whole answer from the arm's served name.
func TestEvalCaseBody(t *testing.T) {
	chat, _ := compileEvalCase(&EvalCase{Messages: []EvalMessage{{Role: "user", Content: "hi"}}, Regex: "."})
	text, _ := compileEvalCase(&EvalCase{Prompt: "Once", MaxTokens: 8, Regex: "."})
	for _, tc := range []struct {
		c    EvalCasePlan
		want string
	}{
		{chat, `{"max_tokens":256,"messages":[{"role":"user","content":"hi"}],"model":"m-int4","stream":false,"temperature":0}`},
		{text, `{"max_tokens":8,"model":"m-int4","prompt":"Once","stream":false,"temperature":0}`},
	} {
		got := string(tc.c.Body("m-int4"))
		if got != tc.want || !json.Valid([]byte(got)) {
			t.Errorf("body %s, want %s", got, tc.want)
		}
	}
	if !chat.Chat || text.Chat {
		t.Error("chat and completion cases mixed up")
	}
}

// A valid policy's eval gate compiles with its defaults.
func TestEvalPlanDefaults(t *testing.T) {
	plan := compileEval(&RolloutEval{Cases: []EvalCase{{Name: "a", Prompt: "x", Regex: "y"}}})
	if plan.Margin != DefaultEvalMargin || plan.Timeout != DefaultEvalTimeout || plan.Concurrency != DefaultEvalConcurrency ||
		len(plan.Cases) != 1 || !strings.EqualFold(plan.Cases[0].Name, "a") {
		t.Fatalf("%+v", plan)
	}
}

// docs/rollouts.md's settings example is a rollout the policy accepts, eval gate and all.
func TestRolloutsDocExampleLoads(t *testing.T) {
	doc, err := os.ReadFile("../docs/rollouts.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "## Settings\n\n```yaml\n")
	block, _, closed := strings.Cut(after, "```")
	if !ok || !closed || !strings.Contains(block, "eval:") {
		t.Fatal("docs/rollouts.md lost its settings example")
	}
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		indented.WriteString("    " + line + "\n")
	}
	policy := `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  models:
  - name: m
    pools:
    - {name: v1, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.1:8000"]}
    - {name: v2, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.2:8000"]}
` + strings.Replace(indented.String(), "    rollout:\n", "    rollout:\n      candidate: {pool: v2}\n", 1) + `  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`
	snap, err := Parse("rollouts.md", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	plan, ok := snap.Rollout(&snap.Policy.Spec.Models[0])
	if !ok || plan.Eval == nil || len(plan.Eval.Cases) != 4 || plan.Shadow == nil {
		t.Fatalf("plan %+v", plan)
	}
}
