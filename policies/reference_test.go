package policies

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/invopop/jsonschema"
)

// referencePath is the generated configuration reference.
const referencePath = "../docs/reference/policy.md"

// The configuration reference is generated from the policy's schema and the doc comments of its types' fields:
// a field added, renamed or documented anew without regenerating it (go test ./policies -run Reference -update)
// fails here.
func TestPolicyReferenceInSync(t *testing.T) {
	got, err := policyReference()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.MkdirAll("../docs/reference", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(referencePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./policies -run Reference -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s is out of date: go test ./policies -run Reference -update", referencePath)
	}
}

// policyReference renders every type of the policy, from the document's root down, as a table of its fields.
func policyReference() (string, error) {
	s, err := policySchema()
	if err != nil {
		return "", err
	}
	docs, err := fieldDocs(".")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("# Policy reference\n\n")
	b.WriteString("Generated from the policy's JSON Schema (`infergate schema`) and the doc comments of its Go types by\n")
	b.WriteString("`go test ./policies -run Reference -update`; a test fails when it is out of date. What the fields do together,\n")
	b.WriteString("with examples, is in [configuration.md](../configuration.md). A field left out takes its default; `infergate\n")
	b.WriteString("validate` reports every problem with its file and line.\n")
	order := []string{"Policy"}
	seen := map[string]bool{"Policy": true}
	for i := 0; i < len(order); i++ {
		name := order[i]
		def := s.Definitions[name]
		if name == "Policy" {
			def = s
		}
		b.WriteString("\n## " + name + "\n\n| field | type | constraints | description |\n|---|---|---|---|\n")
		for p := def.Properties.Oldest(); p != nil; p = p.Next() {
			typ, refs := typeOf(p.Value)
			for _, r := range refs {
				if !seen[r] {
					seen[r] = true
					order = append(order, r)
				}
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Key, typ, constraints(p.Value), cell(docs[name][p.Key]))
		}
	}
	return b.String(), nil
}

// typeOf names a property's type, linking the definitions it refers to, and returns them.
func typeOf(s *jsonschema.Schema) (string, []string) {
	switch {
	case s.Ref != "":
		name := strings.TrimPrefix(s.Ref, "#/$defs/")
		return fmt.Sprintf("[%s](#%s)", name, strings.ToLower(name)), []string{name}
	case s.Type == "array" && s.Items != nil:
		t, refs := typeOf(s.Items)
		return "list of " + t, refs
	case s.Type == "object" && s.AdditionalProperties != nil && s.AdditionalProperties != jsonschema.FalseSchema &&
		!reflect.DeepEqual(s.AdditionalProperties, &jsonschema.Schema{}):
		t, refs := typeOf(s.AdditionalProperties)
		return "map of name → " + t, refs
	case s.Type != "":
		return s.Type, nil
	}
	return "any", nil
}

// constraints lists what the schema allows of a value.
func constraints(s *jsonschema.Schema) string {
	if s.Type == "array" && s.Items != nil && s.Items.Ref == "" {
		s = mergeItems(s)
	}
	var c []string
	if len(s.Enum) > 0 {
		var vs []string
		for _, v := range s.Enum {
			vs = append(vs, fmt.Sprintf("`%v`", v))
		}
		c = append(c, "one of "+strings.Join(vs, ", "))
	}
	for _, n := range []struct {
		what string
		v    string
	}{{"≥", string(s.Minimum)}, {">", string(s.ExclusiveMinimum)}, {"≤", string(s.Maximum)}, {"<", string(s.ExclusiveMaximum)}} {
		if n.v != "" {
			c = append(c, n.what+" "+n.v)
		}
	}
	if s.MinLength != nil && *s.MinLength > 0 {
		c = append(c, "not empty")
	}
	if s.MinItems != nil && *s.MinItems > 0 {
		c = append(c, fmt.Sprintf("at least %d", *s.MinItems))
	}
	if s.Pattern != "" {
		c = append(c, "matches `"+strings.ReplaceAll(s.Pattern, "|", `\|`)+"`")
	}
	return strings.Join(c, "; ")
}

// mergeItems reads an array's item constraints as the array's own (a list of endpoints, of key digests).
func mergeItems(s *jsonschema.Schema) *jsonschema.Schema {
	m := *s.Items
	if s.MinItems != nil {
		m.MinItems = s.MinItems
	}
	return &m
}

// cell makes a doc comment one table cell.
func cell(doc string) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(doc), " "), "|", `\|`)
}

// fieldDocs reads the doc comments of every struct field in the package's source, by type and YAML name.
func fieldDocs(dir string) (map[string]map[string]string, error) {
	fset := token.NewFileSet()
	out := map[string]map[string]string{}
	embeds := map[string][]string{} // a struct's inlined structs, whose fields are its own in YAML
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			fields := map[string]string{}
			var pending string // a comment over several fields, e.g. "MinDuration and MinRequests are …"
			for _, fd := range st.Fields.List {
				doc := fd.Doc.Text()
				if doc == "" && len(fd.Names) == 1 && strings.Contains(pending, fd.Names[0].Name) {
					doc = pending // named by the comment over the field before it
				}
				if fd.Doc != nil {
					pending = doc
				}
				if fd.Tag == nil {
					continue
				}
				if id, ok := fd.Type.(*ast.Ident); ok && len(fd.Names) == 0 {
					embeds[ts.Name.Name] = append(embeds[ts.Name.Name], id.Name)
				}
				name, _, _ := strings.Cut(reflect.StructTag(strings.Trim(fd.Tag.Value, "`")).Get("yaml"), ",")
				if name != "" && name != "-" {
					fields[name] = doc
				}
			}
			out[ts.Name.Name] = fields
			return false
		})
	}
	for outer, inner := range embeds {
		for _, in := range inner {
			for k, v := range out[in] {
				if out[outer][k] == "" {
					out[outer][k] = v
				}
			}
		}
	}
	return out, nil
}
