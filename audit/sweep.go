package audit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Sweep deletes the rotated files whose time is past their tenant's retention: rotation time +
// Retention(tenant) < Now(). The rotation time is read from the file name, or is the file's modification time
// when the name does not parse. Only regular *.jsonl files directly in a tenant's directory are considered,
// and never current.jsonl; a retention of 0 (or less) keeps a tenant's files forever.
//
// The tenant of a directory is the one whose file this Log opened there; otherwise the directory's own name
// when it is a safe tenant name (such names are their own directory), so a tenant idle since a restart keeps
// its retention; otherwise (an escaped name not seen in this run) Retention("").
//
// Sweep does nothing in Out mode or without Options.Retention. It returns the number of files removed and
// every error met on the way; it carries on past errors.
func (l *Log) Sweep() (removed int, err error) {
	if l.dir == "" || l.retention == nil {
		return 0, nil
	}
	l.sweepMu.Lock()
	defer l.sweepMu.Unlock()
	now := l.now()
	tenants, err := os.ReadDir(l.dir)
	if err != nil {
		return 0, fmt.Errorf("audit: sweep: %w", err)
	}
	var errs []error
	for _, d := range tenants {
		if !d.IsDir() {
			continue
		}
		keep := l.retention(l.tenantOf(d.Name()))
		if keep <= 0 {
			continue
		}
		n, err := sweepDir(filepath.Join(l.dir, d.Name()), now.Add(-keep))
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// sweepDir removes the rotated files in dir rotated before cutoff.
func sweepDir(dir string, cutoff time.Time) (removed int, err error) {
	files, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("audit: sweep: %w", err)
	}
	var errs []error
	for _, f := range files {
		name := f.Name()
		if name == currentName || !f.Type().IsRegular() || !strings.HasSuffix(name, rotatedExt) {
			continue
		}
		at, _, ok := parseRotated(name)
		if !ok {
			info, err := f.Info()
			if err != nil {
				errs = append(errs, fmt.Errorf("audit: sweep: %w", err))
				continue
			}
			at = info.ModTime()
		}
		if !at.Before(cutoff) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("audit: sweep: %w", err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// parseRotated reads the rotation time and the uniqueness suffix (0 for none) from a rotated file's name,
// e.g. 20261201T103000.123Z.jsonl or 20261201T103000.123Z-2.jsonl. Ordering by (time, seq) orders rotated
// files as they were written.
func parseRotated(name string) (at time.Time, seq int, ok bool) {
	s, ok := strings.CutSuffix(name, rotatedExt)
	if !ok {
		return time.Time{}, 0, false
	}
	if base, n, found := strings.Cut(s, "-"); found {
		v, err := strconv.Atoi(n)
		if err != nil || v <= 0 || n[0] == '+' {
			return time.Time{}, 0, false
		}
		s, seq = base, v
	}
	at, err := time.Parse(rotatedLayout, s)
	if err != nil {
		return time.Time{}, 0, false
	}
	return at, seq, true
}

// tenantOf is the tenant whose retention applies to the directory named dir.
func (l *Log) tenantOf(dir string) string {
	l.namesMu.Lock()
	tenant, ok := l.names[dir]
	l.namesMu.Unlock()
	switch {
	case ok:
		return tenant
	case safeName(dir):
		return dir
	default:
		return ""
	}
}

// sawTenant remembers that tenant's files are in the directory named dir.
func (l *Log) sawTenant(dir, tenant string) {
	l.namesMu.Lock()
	l.names[dir] = tenant
	l.namesMu.Unlock()
}
