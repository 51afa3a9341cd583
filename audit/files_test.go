package audit

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/test/wait"
)

func TestPerTenantFiles(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, Options{Dir: dir})
	for i, tenant := range []string{"acme", "globex", "acme", "Initech Corp", "acme"} {
		l.Write(rec(tenant, i))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir  string
		want []int
	}{
		{"acme", []int{0, 2, 4}},
		{"globex", []int{1}},
		{dirName("Initech Corp"), []int{3}},
	} {
		got := readRecords(t, filepath.Join(dir, tc.dir, currentName))
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d lines, want %d", tc.dir, len(got), len(tc.want))
		}
		for i, r := range got {
			if r.RequestID != rec("", tc.want[i]).RequestID || r.Tenant == "" {
				t.Fatalf("%s line %d: %+v", tc.dir, i, r)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 3 {
		t.Fatalf("%d tenant directories (%v), want 3", len(entries), err)
	}
	for _, p := range []string{filepath.Join(dir, "acme"), filepath.Join(dir, "acme", currentName)} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if limit := os.FileMode(filePerm); st.IsDir() {
			limit = dirPerm
			if st.Mode().Perm()&^limit != 0 {
				t.Fatalf("%s has mode %v", p, st.Mode())
			}
		} else if st.Mode().Perm()&^limit != 0 {
			t.Fatalf("%s has mode %v", p, st.Mode())
		}
	}
	if got := testutil.ToFloat64(l.m.lines); got != 5 {
		t.Fatalf("lines_total = %v, want 5", got)
	}
}

// TestUnsafeTenantStaysInDir checks that hostile tenant names cannot put files outside Dir.
func TestUnsafeTenantStaysInDir(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "audit")
	l := mustNew(t, Options{Dir: dir})
	hostile := []string{"../escaped", "../../etc/passwd", "/abs", "..", ".", "", "a/../../b", "nul\x00byte"}
	for i, tenant := range hostile {
		l.Write(rec(tenant, i))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Fatalf("parent holds %d entries, want only audit/", len(entries))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(hostile) {
		t.Fatalf("%d directories for %d distinct names", len(entries), len(hostile))
	}
	for i, tenant := range hostile {
		got := readRecords(t, filepath.Join(dir, dirName(tenant), currentName))
		if len(got) != 1 || got[0].Tenant != tenant || got[0].RequestID != rec("", i).RequestID {
			t.Fatalf("tenant %q: %+v", tenant, got)
		}
	}
}

// TestFlushWhenIdle checks a line reaches the file without Close once the writer has caught up.
func TestFlushWhenIdle(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, Options{Dir: dir})
	l.Write(rec("acme", 1))
	wait.For(t, "the line in current.jsonl", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "acme", currentName))
		return strings.Contains(string(data), `"request_id":"req-0001"`) && strings.HasSuffix(string(data), "\n")
	})
}

// rotatedFile is a tenant's file, in the order it was written.
type rotatedFile struct {
	name string
	data []byte
}

// tenantFiles reads a tenant's rotated files oldest first, then current.jsonl.
func tenantFiles(t *testing.T, dir string) []rotatedFile {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		name string
		at   int64
		seq  int
	}
	var keys []key
	var current bool
	for _, e := range entries {
		if e.Name() == currentName {
			current = true
			continue
		}
		at, seq, ok := parseRotated(e.Name())
		if !ok {
			t.Fatalf("unexpected file %s", e.Name())
		}
		keys = append(keys, key{e.Name(), at.UnixNano(), seq})
	}
	slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) })
	names := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		names = append(names, k.name)
	}
	if current {
		names = append(names, currentName)
	}
	files := make([]rotatedFile, 0, len(names))
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rotatedFile{n, data})
	}
	return files
}

func TestRotation(t *testing.T) {
	const lines = 7
	for _, tc := range []struct {
		name      string
		maxBytes  func(line int) int64
		wantFiles int
	}{
		{"two lines fit exactly", func(n int) int64 { return int64(2 * n) }, 4},
		{"one byte short of two lines", func(n int) int64 { return int64(2*n - 1) }, 7},
		{"two and a half lines", func(n int) int64 { return int64(2*n + n/2) }, 4},
		{"a line is larger than the limit", func(n int) int64 { return int64(n - 1) }, 7},
		{"no rotation", func(int) int64 { return 1 << 20 }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			n := lineLen(t, "acme")
			maxBytes := tc.maxBytes(n)
			l := mustNew(t, Options{Dir: dir, MaxFileBytes: maxBytes, Now: newClock(t0).now})
			for i := range lines {
				l.Write(rec("acme", i))
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			files := tenantFiles(t, filepath.Join(dir, "acme"))
			if len(files) != tc.wantFiles {
				t.Fatalf("%d files, want %d", len(files), tc.wantFiles)
			}
			next := 0
			for _, f := range files {
				if int64(len(f.data)) > maxBytes && len(parseLines(t, f.data)) > 1 {
					t.Fatalf("%s holds %d bytes, more than %d", f.name, len(f.data), maxBytes)
				}
				for _, r := range parseLines(t, f.data) { // also fails on a split line
					if r != rec("acme", next) {
						t.Fatalf("%s: got %+v, want line %d", f.name, r, next)
					}
					next++
				}
			}
			if next != lines {
				t.Fatalf("%d lines in all, want %d", next, lines)
			}
			if got := testutil.ToFloat64(l.m.lines); got != lines {
				t.Fatalf("lines_total = %v", got)
			}
		})
	}
}

// TestRotationNames checks rotated files are named by the rotation time, uniquely within a millisecond.
func TestRotationNames(t *testing.T) {
	dir := t.TempDir()
	clk := newClock(t0)
	n := lineLen(t, "acme")
	l := mustNew(t, Options{Dir: dir, MaxFileBytes: int64(n), Now: clk.now})
	for i := range 4 { // three rotations at t0
		l.Write(rec("acme", i))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range tenantFiles(t, filepath.Join(dir, "acme")) {
		got = append(got, f.name)
	}
	want := []string{"20261201T103000.123Z.jsonl", "20261201T103000.123Z-1.jsonl", "20261201T103000.123Z-2.jsonl", currentName}
	if !slices.Equal(got, want) {
		t.Fatalf("files %q, want %q", got, want)
	}
}

// TestReopenAppends checks a new Log appends to an existing current.jsonl, counts its size towards rotation,
// and ends a cut-short last line before appending.
func TestReopenAppends(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "acme"), dirPerm); err != nil {
		t.Fatal(err)
	}
	n := lineLen(t, "acme")
	partial := strings.Repeat("x", n-1) // no '\n': a crash cut it short
	if err := os.WriteFile(filepath.Join(dir, "acme", currentName), []byte(partial), filePerm); err != nil {
		t.Fatal(err)
	}
	l := mustNew(t, Options{Dir: dir, MaxFileBytes: int64(2 * n), Now: newClock(t0).now})
	l.Write(rec("acme", 0)) // fits: n-1 + '\n' + n = 2n
	l.Write(rec("acme", 1)) // rotates
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files := tenantFiles(t, filepath.Join(dir, "acme"))
	if len(files) != 2 {
		t.Fatalf("%d files, want 2", len(files))
	}
	first := strings.SplitAfter(string(files[0].data), "\n")
	if first[0] != partial+"\n" || len(parseLines(t, []byte(strings.Join(first[1:], "")))) != 1 {
		t.Fatalf("rotated file %q", files[0].data)
	}
	if got := parseLines(t, files[1].data); len(got) != 1 || got[0] != rec("acme", 1) {
		t.Fatalf("current.jsonl holds %+v", got)
	}
}

// TestOpenFilesBounded writes to more tenants than may be open at once: the least recently written file is
// closed and reopened later without losing or mixing lines.
func TestOpenFilesBounded(t *testing.T) {
	dir := t.TempDir()
	const maxOpen, tenants, rounds = 2, 5, 3
	l, err := newLog(Options{Dir: dir}, maxOpen)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"t0", "t1", "t2", "t3", "t4"}
	for round := range rounds {
		for i, tenant := range names {
			l.Write(rec(tenant, round*tenants+i))
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if peak := l.sink.(*dirSink).peakOpen; peak != maxOpen {
		t.Fatalf("%d files open at once, want %d", peak, maxOpen)
	}
	for i, tenant := range names {
		got := readRecords(t, filepath.Join(dir, tenant, currentName))
		if len(got) != rounds {
			t.Fatalf("%s: %d lines, want %d", tenant, len(got), rounds)
		}
		for round, r := range got {
			if r != rec(tenant, round*tenants+i) {
				t.Fatalf("%s line %d: %+v", tenant, round, r)
			}
		}
	}
}

func TestOpenFailureCounted(t *testing.T) {
	dir := t.TempDir()
	l := mustNew(t, Options{Dir: dir})
	// A file where the tenant's directory should be: opening fails, the line is lost and counted.
	if err := os.WriteFile(filepath.Join(dir, "blocked"), nil, filePerm); err != nil {
		t.Fatal(err)
	}
	l.Write(rec("blocked", 0))
	l.Write(rec("fine", 1))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(l.m.errors); got != 1 {
		t.Fatalf("write_errors_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(l.m.lines); got != 1 {
		t.Fatalf("lines_total = %v, want 1", got)
	}
}
