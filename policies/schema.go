package policies

import (
	"encoding/json"
	"fmt"

	"github.com/invopop/jsonschema"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker/scorers"
)

// JSONSchema returns a JSON Schema of the policy document, so editors (yaml-language-server and the like)
// complete fields and flag typos before the file ever reaches `infergate validate`.
func JSONSchema() ([]byte, error) {
	s, err := policySchema()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal policy schema: %w", err)
	}
	return append(out, '\n'), nil
}

// policySchema reflects the policy's types into a schema (docs/reference/policy.md is generated from it too).
func policySchema() (*jsonschema.Schema, error) {
	r := &jsonschema.Reflector{
		FieldNameTag:               "yaml",
		RequiredFromJSONSchemaTags: false,
		ExpandedStruct:             true,
	}
	s := r.Reflect(&Policy{})
	if err := addPatterns(s); err != nil {
		return nil, err
	}
	s.ID = "https://infergate.io/schemas/policy-v1alpha1.json"
	s.Title = "infergate Policy"
	s.Description = "Routing policy for an infergate LLM gateway: hardware classes, models, pools, fallbacks and tenants."
	return s, nil
}

// Patterns the validator enforces that struct tags cannot say (they apply to list items): the same rules, so an
// editor flags what `infergate validate` refuses. TestSchemaAgreesWithValidate holds the two together.
const (
	// PatternKeyDigest is an API key's digest as a policy holds it.
	PatternKeyDigest = `^sha256:[0-9a-fA-F]{64}$`
	// PatternEndpoint is a replica address: IPv4:port or [IPv6]:port, no host names.
	PatternEndpoint = `^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]):[0-9]{1,5}$|^\[[0-9a-fA-F:.]+\]:[0-9]{1,5}$`
	// PatternClusterName is a pool or fallback name, which becomes part of an Envoy cluster name.
	PatternClusterName = `^[a-z0-9._-]+$`
)

func addPatterns(s *jsonschema.Schema) error {
	set := func(def, prop string, f func(*jsonschema.Schema)) error {
		d, ok := s.Definitions[def]
		if !ok || d.Properties == nil {
			return fmt.Errorf("policy schema: no definition %s", def)
		}
		p, ok := d.Properties.Get(prop)
		if !ok {
			return fmt.Errorf("policy schema: %s has no property %s", def, prop)
		}
		f(p)
		return nil
	}
	items := func(pattern string) func(*jsonschema.Schema) {
		return func(p *jsonschema.Schema) { p.Items.Pattern = pattern }
	}
	for _, e := range []struct {
		def, prop string
		f         func(*jsonschema.Schema)
	}{
		{"Tenant", "apiKeys", items(PatternKeyDigest)},
		{"Pool", "endpoints", items(PatternEndpoint)},
		{"Pool", "name", func(p *jsonschema.Schema) { p.Pattern = PatternClusterName }},
		{"Fallback", "name", func(p *jsonschema.Schema) { p.Pattern = PatternClusterName }},
		// The engines come from fleet's dialect registry, not a struct tag, so the schema lists exactly the
		// engines validation accepts and the scraper reads.
		{"Pool", "engine", func(p *jsonschema.Schema) {
			p.Enum = nil
			for _, n := range fleet.EngineNames() {
				p.Enum = append(p.Enum, n)
			}
		}},
		// The weights' names come from the picker's scorer table: an editor completes them and flags a typo,
		// as validation does.
		{"Routing", "weights", scorerWeights},
	} {
		if err := set(e.def, e.prop, e.f); err != nil {
			return err
		}
	}
	return nil
}

// scorerWeights makes routing.weights an object with one non-negative number per scorer of the table, and no
// other key.
func scorerWeights(p *jsonschema.Schema) {
	p.Properties = jsonschema.NewProperties()
	for _, s := range scorers.Default {
		p.Properties.Set(s.Name, &jsonschema.Schema{Type: "number", Minimum: json.Number("0"),
			Description: fmt.Sprintf("weight of the %s scorer (default %v)", s.Name, s.DefaultWeight)})
	}
	p.AdditionalProperties = jsonschema.FalseSchema
}
