package policies

import (
	"encoding/json"
	"fmt"

	"github.com/invopop/jsonschema"
)

// JSONSchema returns a JSON Schema of the policy document, so editors (yaml-language-server and the like)
// complete fields and flag typos before the file ever reaches `infergate validate`.
func JSONSchema() ([]byte, error) {
	r := &jsonschema.Reflector{
		FieldNameTag:               "yaml",
		RequiredFromJSONSchemaTags: false,
		ExpandedStruct:             true,
	}
	s := r.Reflect(&Policy{})
	s.ID = "https://infergate.io/schemas/policy-v1alpha1.json"
	s.Title = "infergate Policy"
	s.Description = "Routing policy for an infergate LLM gateway: hardware classes, models, pools, fallbacks and tenants."
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal policy schema: %w", err)
	}
	return append(out, '\n'), nil
}
