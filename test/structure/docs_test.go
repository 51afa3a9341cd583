package structure_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeLimit is the README's size bound (issue #37): what it is, the quickstart, how it fits beside Envoy and a
// map of docs/; the rest lives in docs/.
const readmeLimit = 15 << 10

// benchmarksLimit bounds BENCHMARKS.md (issue #37): the current result of each benchmark, not a diary.
const benchmarksLimit = 25 << 10

// operatorDocs are the documents an operator reads, whose links must lead somewhere.
func operatorDocs(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "BENCHMARKS.md", "RELIABILITY.md", "deploy/helm/infergate/README.md", "deploy/observability/README.md"}
	more, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	deeper, _ := filepath.Glob("../../docs/*/*.md")
	for _, f := range append(more, deeper...) {
		files = append(files, strings.TrimPrefix(f, "../../"))
	}
	return files
}

var (
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fenced   = regexp.MustCompile("(?s)```.*?```")
	headings = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
)

// anchor is GitHub's id for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to
// hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '×' && r != '→':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the ids of a Markdown file's headings.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range headings.FindAllStringSubmatch(fenced.ReplaceAllString(string(b), ""), -1) {
		out[anchor(m[1])] = true
	}
	return out
}

// Every relative link of the operator's documents names a file of the repository, and every #fragment into a
// Markdown file one of its headings; the README stays within its bound.
func TestDocsLinksResolve(t *testing.T) {
	for _, doc := range operatorDocs(t) {
		b, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatal(err)
		}
		text := fenced.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := filepath.Join("../..", filepath.Dir(doc), file)
			if file == "" {
				path = filepath.Join("../..", doc)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s: no such file", doc, target)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[frag] {
				t.Errorf("%s links to %s: no heading with that anchor", doc, target)
			}
		}
	}
	if fi, err := os.Stat("../../README.md"); err != nil || fi.Size() > readmeLimit {
		t.Errorf("README.md is %d bytes, over %d: move detail to docs/", fi.Size(), readmeLimit)
	}
	if fi, err := os.Stat("../../BENCHMARKS.md"); err != nil || fi.Size() > benchmarksLimit {
		t.Errorf("BENCHMARKS.md is %d bytes, over %d: it holds each benchmark's current result; history stays in git", fi.Size(), benchmarksLimit)
	}
}
