package policies

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Problem is one thing wrong with a policy file, located so an editor can jump to it.
type Problem struct {
	File    string
	Line    int
	Column  int
	Path    string // e.g. spec.models[0].pools[1].hardwareClass; empty for syntax errors
	Message string
}

func (p Problem) String() string {
	loc := p.File
	if p.Line > 0 {
		loc += ":" + strconv.Itoa(p.Line)
		if p.Column > 0 {
			loc += ":" + strconv.Itoa(p.Column)
		}
	}
	if p.Path != "" {
		return loc + ": " + p.Path + ": " + p.Message
	}
	return loc + ": " + p.Message
}

// InvalidError lists every problem found in one policy file, so the platform team fixes them in one pass
// instead of one per reload.
type InvalidError struct {
	Problems []Problem
}

func (e *InvalidError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return fmt.Sprintf("invalid policy (%d problems):\n%s", len(e.Problems), strings.Join(lines, "\n"))
}

// LoadFile reads, strictly decodes and validates a policy file. On failure the error is an *InvalidError
// (or an I/O error wrapped with the path).
func LoadFile(path string) (*Snapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	return Parse(path, data)
}

func hasServices(pol *Policy) bool {
	for _, m := range pol.Spec.Models {
		for _, p := range m.Pools {
			if p.Service != nil {
				return true
			}
		}
	}
	return false
}

// MaxPolicyBytes bounds a policy file: real ones are kilobytes, and the decoder's work grows with the input.
// (Nesting is bounded by yaml.v3 itself, at 10,000 levels.)
const MaxPolicyBytes = 16 << 20

// Parse decodes and validates policy bytes; name is used in problem locations.
func Parse(name string, data []byte) (*Snapshot, error) { return ParseResolved(name, data, nil) }

// ParseResolved is Parse with the endpoints of pools that name a Service filled in from r (empty without
// one); the version then also names the endpoints.
func ParseResolved(name string, data []byte, r EndpointResolver) (*Snapshot, error) {
	if len(data) > MaxPolicyBytes {
		return nil, &InvalidError{Problems: []Problem{{File: name, Line: 1,
			Message: fmt.Sprintf("policy file is %d bytes, more than the %d a policy may have", len(data), MaxPolicyBytes)}}}
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &InvalidError{Problems: []Problem{yamlProblem(name, err)}}
	}
	if root.Kind == 0 || len(root.Content) == 0 {
		return nil, &InvalidError{Problems: []Problem{{File: name, Line: 1, Message: "empty policy document"}}}
	}
	doc := root.Content[0]

	var pol Policy
	var problems []Problem
	duplicateKey := false
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&pol); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			// Unknown keys and values of the wrong type are reported by the walk below, with their column and
			// path; yaml.v3's own messages are kept for what it alone sees (duplicate keys), or should the walk
			// find nothing.
			shape := shapeProblems(name, doc)
			problems = append(problems, shape...)
			for _, msg := range te.Errors {
				dup := strings.Contains(msg, "already defined")
				// A duplicate key drops the whole mapping it is in, so checks on it would only add noise.
				duplicateKey = duplicateKey || dup
				if dup || len(shape) == 0 {
					problems = append(problems, typeProblem(name, msg))
				}
			}
		} else {
			// A structural error stops decoding: checking the half-read policy would only add noise.
			return nil, &InvalidError{Problems: []Problem{yamlProblem(name, err)}}
		}
	}
	if !duplicateKey {
		v := validator{file: name, root: doc}
		v.policy(&pol)
		problems = append(problems, v.problems...)
	}
	if len(problems) > 0 {
		sort.SliceStable(problems, func(i, j int) bool {
			if problems[i].Line != problems[j].Line {
				return problems[i].Line < problems[j].Line
			}
			return problems[i].Column < problems[j].Column
		})
		return nil, &InvalidError{Problems: problems}
	}
	sum := sha256.Sum256(data)
	version := hex.EncodeToString(sum[:6])
	if hasServices(&pol) {
		version += "-" + resolve(&pol, r)
	}
	return compile(&pol, name, version, time.Now()), nil
}

var yamlLineRe = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// typeProblem turns one of yaml.v3's "line N: message" strings into a Problem.
func typeProblem(file, msg string) Problem {
	if m := yamlLineRe.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{File: file, Line: line, Message: friendlyYAML(m[2])}
	}
	return Problem{File: file, Message: friendlyYAML(msg)}
}

func yamlProblem(file string, err error) Problem {
	return typeProblem(file, strings.TrimPrefix(err.Error(), "yaml: "))
}

var notFoundRe = regexp.MustCompile(`^field (\S+) not found in type policies\.(\w+)$`)

// friendlyYAML rewords yaml.v3 messages that name Go types, which mean nothing to a policy author.
func friendlyYAML(msg string) string {
	if m := notFoundRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("unknown field %q in %s", m[1], m[2])
	}
	msg = strings.ReplaceAll(msg, "!!str", "a string")
	msg = strings.ReplaceAll(msg, "!!seq", "a list")
	msg = strings.ReplaceAll(msg, "!!map", "a mapping")
	return strings.ReplaceAll(msg, "policies.", "")
}
