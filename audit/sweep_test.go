package audit

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/infergate/infergate/test/wait"
)

// touch creates dir/name, with modification time mtime when it is not zero.
func touch(t *testing.T, dir, name string, mtime time.Time) {
	t.Helper()
	if err := os.MkdirAll(dir, dirPerm); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("{}\n"), filePerm); err != nil {
		t.Fatal(err)
	}
	if !mtime.IsZero() {
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
}

func rotatedName(at time.Time) string { return at.UTC().Format(rotatedLayout) + rotatedExt }

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	now := t0.Add(30 * 24 * time.Hour)
	clk := newClock(now)
	retention := map[string]time.Duration{
		"short":     time.Hour,
		"long":      365 * 24 * time.Hour,
		"Odd Name":  time.Hour, // seen in this run: looked up by its name, not its directory's
		"forever":   0,
		"idle-safe": time.Hour, // not seen in this run, but its directory is its name
		"":          2 * time.Hour,
	}
	l := mustNew(t, Options{Dir: dir, Now: clk.now, SweepEvery: -1, Retention: func(tenant string) time.Duration {
		return retention[tenant]
	}})
	for i, tenant := range []string{"short", "long", "Odd Name", "forever"} {
		l.Write(rec(tenant, i)) // opens each tenant's current.jsonl, so the Log has seen them
	}
	wait.For(t, "the tenants' files", func() bool {
		for _, d := range []string{"short", "long", dirName("Odd Name"), "forever"} {
			if _, err := os.Stat(filepath.Join(dir, d, currentName)); err != nil {
				return false
			}
		}
		return true
	})

	old, recent := now.Add(-90*time.Minute), now.Add(-30*time.Minute)
	ancient := now.Add(-100 * 24 * time.Hour)
	unseen := filepath.Join(dir, dirName("gone tenant")) // Retention("") = 2h
	for _, f := range []struct {
		dir, name string
		mtime     time.Time
	}{
		{"short", rotatedName(old), time.Time{}},
		{"short", rotatedName(old)[:20] + "-1.jsonl", time.Time{}},
		{"short", rotatedName(recent), time.Time{}},
		{"short", "manual-copy.jsonl", ancient}, // no rotation time in the name: mtime decides
		{"short", "fresh-copy.jsonl", recent},
		{"short", "notes.txt", ancient}, // not a .jsonl file: never touched
		{"long", rotatedName(old), time.Time{}},
		{"long", rotatedName(ancient), time.Time{}},
		{dirName("Odd Name"), rotatedName(old), time.Time{}},
		{"forever", rotatedName(ancient), time.Time{}},
		{"idle-safe", rotatedName(old), time.Time{}},
		{filepath.Base(unseen), rotatedName(old), time.Time{}},
		{filepath.Base(unseen), rotatedName(now.Add(-3 * time.Hour)), time.Time{}},
	} {
		touch(t, filepath.Join(dir, f.dir), f.name, f.mtime)
	}
	// current.jsonl is never removed, however old.
	for _, d := range []string{"short", filepath.Base(unseen)} {
		touch(t, filepath.Join(dir, d), currentName, ancient)
	}

	removed, err := l.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"short":               {currentName, "fresh-copy.jsonl", "notes.txt", rotatedName(recent)},
		"long":                {currentName, rotatedName(ancient), rotatedName(old)},
		dirName("Odd Name"):   {currentName},
		"forever":             {currentName, rotatedName(ancient)},
		"idle-safe":           nil,
		filepath.Base(unseen): {currentName, rotatedName(old)},
	}
	for d, names := range want {
		got := listDir(t, filepath.Join(dir, d))
		slices.Sort(names)
		if !slices.Equal(got, names) {
			t.Errorf("%s holds %q, want %q", d, got, names)
		}
	}
	const wantRemoved = 3 /* short */ + 1 /* Odd Name */ + 1 /* idle-safe */ + 1 /* unseen */
	if removed != wantRemoved {
		t.Fatalf("Sweep removed %d files, want %d", removed, wantRemoved)
	}
	if removed, err := l.Sweep(); removed != 0 || err != nil {
		t.Fatalf("second Sweep removed %d (%v), want 0", removed, err)
	}
}

func TestSweepWithoutRetention(t *testing.T) {
	dir := t.TempDir()
	touch(t, filepath.Join(dir, "acme"), rotatedName(t0.Add(-1000*time.Hour)), time.Time{})
	l := mustNew(t, Options{Dir: dir, Now: newClock(t0).now})
	if removed, err := l.Sweep(); removed != 0 || err != nil {
		t.Fatalf("Sweep removed %d (%v)", removed, err)
	}
	out := mustNew(t, Options{Out: os.Stdout, Retention: func(string) time.Duration { return time.Nanosecond }})
	if removed, err := out.Sweep(); removed != 0 || err != nil {
		t.Fatalf("Out-mode Sweep removed %d (%v)", removed, err)
	}
}

// TestPeriodicSweep checks the writer goroutine sweeps on its own every SweepEvery.
func TestPeriodicSweep(t *testing.T) {
	dir := t.TempDir()
	expired := filepath.Join(dir, "acme", rotatedName(t0.Add(-2*time.Hour)))
	touch(t, filepath.Dir(expired), filepath.Base(expired), time.Time{})
	mustNew(t, Options{Dir: dir, Now: newClock(t0).now, SweepEvery: 5 * time.Millisecond,
		Retention: func(string) time.Duration { return time.Hour }})
	wait.For(t, "the periodic sweep", func() bool {
		_, err := os.Stat(expired)
		return os.IsNotExist(err)
	})
}

func TestParseRotated(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   time.Time
		seq  int
		ok   bool
	}{
		{"20261201T103000.123Z.jsonl", t0, 0, true},
		{"20261201T103000.123Z-12.jsonl", t0, 12, true},
		{"20261201T103000.123Z-0.jsonl", time.Time{}, 0, false},
		{"20261201T103000.123Z-x.jsonl", time.Time{}, 0, false},
		{"20261201T103000.123Z-+1.jsonl", time.Time{}, 0, false},
		{"20261201T103000Z.jsonl", time.Time{}, 0, false},
		{"20261201T103000.123Z.json", time.Time{}, 0, false},
		{currentName, time.Time{}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, seq, ok := parseRotated(tc.name)
			if ok != tc.ok || !at.Equal(tc.at) || seq != tc.seq {
				t.Fatalf("parseRotated = %v, %d, %v; want %v, %d, %v", at, seq, ok, tc.at, tc.seq, tc.ok)
			}
		})
	}
	if got := rotatedName(t0); got != "20261201T103000.123Z.jsonl" {
		t.Fatalf("rotation name %q", got)
	}
}
