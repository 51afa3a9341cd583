package audit

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestDirName(t *testing.T) {
	for _, tc := range []struct {
		tenant string
		asIs   bool // the tenant name is its own directory name
	}{
		{"acme", true},
		{"team-a_1.prod", true},
		{"a..b", true}, // one path component, not ".."
		{"-leading-dash", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{".", false},
		{"..", false},
		{"../etc", false},
		{"a/b", false},
		{`a\b`, false},
		{"/abs", false},
		{"Acme", false},
		{"a b", false},
		{"a\x00b", false},
		{"line\nbreak", false},
		{"del\x7f", false},
		{"tenänt", false},
		{"x+0123456789abcdef0123456789abcdef", false}, // looks escaped, but '+' is not allowed as is
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			got := dirName(tc.tenant)
			checkDirName(t, tc.tenant, got)
			if tc.asIs != (got == tc.tenant) {
				t.Fatalf("dirName(%q) = %q, want as is: %v", tc.tenant, got, tc.asIs)
			}
			if !tc.asIs && (!strings.HasPrefix(got, escapedPrefix) || len(got) != len(escapedPrefix)+32) {
				t.Fatalf("dirName(%q) = %q, want x+ and 32 hex digits", tc.tenant, got)
			}
			if again := dirName(tc.tenant); again != got {
				t.Fatalf("dirName(%q) not stable: %q then %q", tc.tenant, got, again)
			}
		})
	}
	if dirName("Acme") == dirName("ACME") || dirName("") == dirName(".") {
		t.Fatal("distinct unsafe names share a directory")
	}
}

// checkDirName fails unless d is one safe path component: the contract FuzzDirName holds dirName to.
func checkDirName(t *testing.T, tenant, d string) {
	t.Helper()
	if d == "" || d == "." || d == ".." || strings.ContainsAny(d, `/\`) || !filepath.IsLocal(d) ||
		filepath.Base(d) != d || len(d) > maxNameLen {
		t.Fatalf("dirName(%q) = %q: not one safe path component", tenant, d)
	}
	for i := range len(d) {
		if c := d[i]; c < 0x21 || c > 0x7e {
			t.Fatalf("dirName(%q) = %q: byte %#x", tenant, d, c)
		}
	}
	if safeName(tenant) != (d == tenant) {
		t.Fatalf("dirName(%q) = %q: a safe name must be kept and only a safe name", tenant, d)
	}
	if d != tenant && safeName(d) {
		t.Fatalf("dirName(%q) = %q: an escaped name must not be a possible tenant name", tenant, d)
	}
}

func FuzzDirName(f *testing.F) {
	for _, s := range []string{"acme", "", ".", "..", "../..", "a/b", "A", "a\x00", strings.Repeat("z", 129), "x+00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tenant string) {
		checkDirName(t, tenant, dirName(tenant))
	})
}
