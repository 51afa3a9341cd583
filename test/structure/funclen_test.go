// Package structure_test holds checks on the shape of the source rather than its behaviour.
package structure_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a request-path function, from its func line to its closing brace (issue #32): past it a
// function does several things, and a reviewer cannot hold it at once.
const maxFuncLines = 80

// requestPath are the packages a request passes through, subpackages included.
var requestPath = []string{
	"extproc", "director", "picker", "openai", "quota", "admission", "telemetry", "audit", "fleet", "policies",
	"placements", "relay",
}

// longFunc is a function whose body spans more than maxFuncLines.
type longFunc struct {
	pos   token.Position
	name  string
	lines int
}

func (f longFunc) String() string {
	return fmt.Sprintf("%s:%d: %s is %d lines (limit %d)", f.pos.Filename, f.pos.Line, f.name, f.lines, maxFuncLines)
}

// TestRequestPathFunctionsAreShort fails naming every request-path function or method over maxFuncLines.
func TestRequestPathFunctionsAreShort(t *testing.T) {
	root := repoRoot(t)
	fset := token.NewFileSet()
	files := 0
	for _, pkg := range requestPath {
		for _, path := range sourceFiles(t, filepath.Join(root, pkg)) {
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files++
			if ast.IsGenerated(f) {
				continue
			}
			for _, lf := range longFuncs(fset, f, maxFuncLines) {
				if rel, err := filepath.Rel(root, lf.pos.Filename); err == nil {
					lf.pos.Filename = rel
				}
				t.Error(lf)
			}
		}
	}
	if files == 0 {
		t.Fatalf("found no source files under %s: the check would pass vacuously", root)
	}
}

// TestLongFuncs checks the measure itself on synthetic sources, so that the guard above can fail.
func TestLongFuncs(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // "name lines" of each function reported
	}{
		{name: "81 lines is too long", src: "package p\n\n" + funcOf("f", 81),
			want: []string{"f 81"}},
		{name: "80 lines is the limit", src: "package p\n\n" + funcOf("f", 80)},
		{name: "one-line function", src: "package p\n\nfunc f() {}\n"},
		{name: "method on a pointer", src: "package p\n\ntype T struct{}\n\n" + funcOf("(t *T) m", 90),
			want: []string{"(*T).m 90"}},
		{name: "method on a generic type", src: "package p\n\ntype T[K any] struct{}\n\n" + funcOf("(t T[K]) m", 82),
			want: []string{"T.m 82"}},
		{name: "doc comment not counted",
			src: "package p\n\n" + strings.Repeat("// doc\n", 10) + funcOf("f", 80)},
		{name: "several, in order", src: "package p\n\n" + funcOf("a", 100) + funcOf("b", 3) + funcOf("c", 81),
			want: []string{"a 100", "c 81"}},
		{name: "declaration without body", src: "package p\n\nfunc f()\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "p.go", tc.src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, lf := range longFuncs(fset, f, maxFuncLines) {
				got = append(got, fmt.Sprintf("%s %d", lf.name, lf.lines))
			}
			if strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
				t.Errorf("reported %q, want %q", got, tc.want)
			}
		})
	}
}

// funcOf writes a function declaration (sig is what follows "func ") spanning exactly n lines.
func funcOf(sig string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "func %s() {\n", sig)
	for range n - 2 {
		b.WriteString("\t_ = 0\n")
	}
	b.WriteString("}\n\n")
	return b.String()
}

// longFuncs lists the functions and methods of f spanning more than limit lines, from the func keyword to
// the closing brace, inclusive; the doc comment is not counted.
func longFuncs(fset *token.FileSet, f *ast.File, limit int) []longFunc {
	var out []longFunc
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start := fset.Position(fd.Pos())
		lines := fset.Position(fd.Body.Rbrace).Line - start.Line + 1
		if lines > limit {
			out = append(out, longFunc{pos: start, name: funcName(fd), lines: lines})
		}
	}
	return out
}

// funcName is a function's name, or a method's as the go tool writes it: (*T).m or T.m.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	star := false
	if s, ok := typ.(*ast.StarExpr); ok {
		typ, star = s.X, true
	}
	switch g := typ.(type) { // a generic receiver: T[K] or T[K, V]
	case *ast.IndexExpr:
		typ = g.X
	case *ast.IndexListExpr:
		typ = g.X
	}
	name := "?"
	if id, ok := typ.(*ast.Ident); ok {
		name = id.Name
	}
	if star {
		return "(*" + name + ")." + fd.Name.Name
	}
	return name + "." + fd.Name.Name
}

// sourceFiles lists the non-test .go files under dir, skipping what the go tool skips (testdata, and
// directories whose names start with . or _).
func sourceFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != dir && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// repoRoot is the nearest directory at or above the working directory that holds go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}
