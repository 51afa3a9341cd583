// Package manifest reads multi-document YAML manifests (Kubernetes, Istio, Envoy Gateway) for the tests that
// check them against infergate's code, since no cluster runs here.
package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// DecodeAll returns every non-empty document of a YAML file as generic maps.
func DecodeAll(t testing.TB, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// Get walks nested maps by key; nil when a step is missing.
func Get(m any, path ...string) any {
	for _, k := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[k]
	}
	return m
}

// StrictDecode turns one document (as DecodeAll reads it) into an API type, refusing unknown fields: a field
// the real type does not have is a manifest the cluster would reject or silently ignore.
func StrictDecode(t testing.TB, doc map[string]any, into any) {
	t.Helper()
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s %v: %v", doc["kind"], Get(doc, "metadata", "name"), err)
	}
}
