package policies

import (
	"fmt"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// shapeProblems walks the YAML node tree beside the Policy type and reports, at the node's line and column
// and with its path in the document, every key the type does not have (with the nearest known key as a
// suggestion) and every value yaml.v3 cannot decode into its field. yaml.v3's own messages for these name Go
// types and lose the column; a policy author needs `spec.gateway.defaultMaxToken`, not `Gateway`.
func shapeProblems(file string, doc *yaml.Node) []Problem {
	w := shapeWalker{file: file}
	w.walk(doc, reflect.TypeFor[Policy](), nil)
	return w.problems
}

type shapeWalker struct {
	file     string
	problems []Problem
	depth    int
}

// maxShapeDepth bounds the walk; the Policy type nests far less deeply, anything below is reported by type.
const maxShapeDepth = 64

func (w *shapeWalker) fail(n *yaml.Node, path []seg, format string, args ...any) {
	w.problems = append(w.problems, Problem{File: w.file, Line: n.Line, Column: n.Column, Path: pathString(path),
		Message: fmt.Sprintf(format, args...)})
}

func (w *shapeWalker) walk(n *yaml.Node, t reflect.Type, path []seg) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if w.depth++; w.depth > maxShapeDepth {
		w.depth--
		return
	}
	defer func() { w.depth-- }()
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value: the zero value, which validation judges
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		w.mapping(n, t, path)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.fail(n, path, "must be a mapping, got %s", describeNode(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), append(clonePath(path), n.Content[i].Value))
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "must be a list, got %s", describeNode(n))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), append(clonePath(path), i))
		}
	default:
		v := reflect.New(t)
		if n.Kind != yaml.ScalarNode || n.Decode(v.Interface()) != nil {
			w.fail(n, path, "must be %s, got %s", describeType(t), describeNode(n))
		}
	}
}

// mapping checks a struct's keys and walks their values.
func (w *shapeWalker) mapping(n *yaml.Node, t reflect.Type, path []seg) {
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "must be a mapping, got %s", describeNode(n))
		return
	}
	fields := yamlFields(t)
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		at := append(clonePath(path), key.Value)
		ft, ok := fields[key.Value]
		if !ok {
			msg := "unknown field"
			if s := nearest(key.Value, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", s)
			}
			w.fail(key, at, "%s", msg)
			continue
		}
		w.walk(val, ft, at)
	}
}

// yamlFields maps a struct's YAML keys (inlined structs' included) to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

// nearest is the known key closest to an unknown one, when it is close enough to be a typo.
func nearest(key string, fields map[string]reflect.Type) string {
	best, bestDist := "", len(key)/2+2
	for k := range fields {
		if d := editDistance(strings.ToLower(key), strings.ToLower(k)); d < bestDist || (d == bestDist && k < best) {
			best, bestDist = k, d
		}
	}
	if bestDist > max(2, len(key)/3) {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between two short keys.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return fmt.Sprintf("%q", v)
}

func clonePath(p []seg) []seg { return append([]seg(nil), p...) }
