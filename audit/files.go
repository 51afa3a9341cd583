package audit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

const (
	// currentName is the file a tenant's lines are appended to; rotation renames it.
	currentName = "current.jsonl"
	// rotatedLayout names a rotated file by the UTC time of its rotation, e.g. 20261201T103000.123Z.jsonl.
	// When that name is taken (two rotations in one millisecond) "-1", "-2"… goes before ".jsonl".
	rotatedLayout = "20060102T150405.000Z"
	rotatedExt    = ".jsonl"
	dirPerm       = 0o750
	filePerm      = 0o640
	// maxOpenFiles bounds the tenants' files held open at once; the least recently written is closed first.
	maxOpenFiles = 64
	// bufSize is each open file's write buffer: 64 files hold at most 2 MiB of lines in memory.
	bufSize = 32 << 10
)

// dirSink keeps one current.jsonl per tenant under root and rotates it by size.
type dirSink struct {
	root     string
	maxBytes int64
	maxOpen  int
	now      func() time.Time
	seen     func(dir, tenant string) // called when a tenant's file is opened, for Sweep's retention lookup
	fail     func(error)              // reports an error that did not lose the line
	written  func(int)                // counts lines once flushed

	open     map[string]*tenantFile // by tenant name
	dirty    []*tenantFile          // written to since the last flush
	tick     uint64                 // orders uses, for closing the least recently written file
	peakOpen int                    // most files open at once, for tests
}

// tenantFile is one tenant's open current.jsonl.
type tenantFile struct {
	tenant  string
	dir     string
	f       *os.File // nil once closed
	w       *bufio.Writer
	size    int64 // bytes in the file, counting those still in w
	pending int   // lines in w
	used    uint64
	dirty   bool
}

func newDirSink(root string, maxBytes int64, maxOpen int, now func() time.Time, l *Log) *dirSink {
	return &dirSink{
		root: root, maxBytes: maxBytes, maxOpen: maxOpen, now: now, seen: l.sawTenant, fail: l.fail,
		written: l.written, open: make(map[string]*tenantFile),
	}
}

// write appends line to the tenant's current.jsonl, rotating first when the line would take the file past
// maxBytes. A line is never split across files; a file holds more than maxBytes only when a single line does.
func (s *dirSink) write(tenant string, line []byte) error {
	tf, err := s.get(tenant)
	if err != nil {
		return err
	}
	if tf.size > 0 && tf.size+int64(len(line)) > s.maxBytes {
		if err := s.rotate(tf); err != nil {
			if tf.f == nil {
				return err
			}
			s.fail(err) // not rotated, but current.jsonl is still open: keep the line rather than lose it
		}
	}
	n, err := tf.w.Write(line)
	tf.size += int64(n)
	if err != nil {
		s.discard(tf)
		return fmt.Errorf("audit: write %s: %w", tf.dir, err)
	}
	tf.pending++
	if !tf.dirty {
		tf.dirty = true
		s.dirty = append(s.dirty, tf)
	}
	return nil
}

// get returns the tenant's open file, opening it (and closing the least recently written one when maxOpen
// files are open) when needed.
func (s *dirSink) get(tenant string) (*tenantFile, error) {
	s.tick++
	if tf, ok := s.open[tenant]; ok {
		tf.used = s.tick
		return tf, nil
	}
	if len(s.open) >= s.maxOpen {
		s.evict()
	}
	name := dirName(tenant)
	tf := &tenantFile{tenant: tenant, dir: filepath.Join(s.root, name), used: s.tick}
	if err := s.openCurrent(tf); err != nil {
		return nil, err
	}
	s.seen(name, tenant)
	s.open[tenant] = tf
	s.peakOpen = max(s.peakOpen, len(s.open))
	return tf, nil
}

// openCurrent opens (creating) tf's current.jsonl for appending. When the file does not end in '\n' (a crash
// or a failed write cut its last line short) it starts with one, so the next line is not glued to the broken
// one.
func (s *dirSink) openCurrent(tf *tenantFile) error {
	if err := os.MkdirAll(tf.dir, dirPerm); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(tf.dir, currentName), os.O_RDWR|os.O_APPEND|os.O_CREATE, filePerm)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit: %w", err)
	}
	if tf.w == nil {
		tf.w = bufio.NewWriterSize(f, bufSize)
	} else {
		tf.w.Reset(f)
	}
	tf.f, tf.size = f, st.Size()
	if tf.size > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, tf.size-1); err != nil {
			s.fail(fmt.Errorf("audit: %w", err))
		} else if last[0] != '\n' {
			_ = tf.w.WriteByte('\n') // cannot fail: the buffer is empty
			tf.size++
		}
	}
	return nil
}

// rotate closes tf's current.jsonl, renames it to the rotation time and opens a new one. On error tf.f says
// whether a current.jsonl is open to write to.
func (s *dirSink) rotate(tf *tenantFile) error {
	if err := s.closeFile(tf); err != nil {
		delete(s.open, tf.tenant)
		return err
	}
	renameErr := rotateCurrent(tf.dir, s.now())
	if err := s.openCurrent(tf); err != nil {
		delete(s.open, tf.tenant)
		return errors.Join(renameErr, err)
	}
	return renameErr
}

// rotateCurrent renames dir/current.jsonl to the first free name for rotation time t.
func rotateCurrent(dir string, t time.Time) error {
	base := t.UTC().Format(rotatedLayout)
	for i := range 10000 {
		name := base + rotatedExt
		if i > 0 {
			name = base + "-" + strconv.Itoa(i) + rotatedExt
		}
		p := filepath.Join(dir, name)
		_, err := os.Lstat(p)
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("audit: rotate: %w", err)
		}
		if err := os.Rename(filepath.Join(dir, currentName), p); err != nil {
			return fmt.Errorf("audit: rotate: %w", err)
		}
		return nil
	}
	return fmt.Errorf("audit: rotate %s: no free name for %s", dir, base)
}

// evict closes the least recently written open file.
func (s *dirSink) evict() {
	var lru *tenantFile
	for _, tf := range s.open {
		if lru == nil || tf.used < lru.used {
			lru = tf
		}
	}
	if lru == nil {
		return
	}
	delete(s.open, lru.tenant)
	if err := s.closeFile(lru); err != nil {
		s.fail(err)
	}
}

// discard closes a file whose writer has failed, dropping what it buffered; the tenant's next line opens the
// file again.
func (s *dirSink) discard(tf *tenantFile) {
	delete(s.open, tf.tenant)
	if tf.f != nil {
		_ = tf.f.Close()
		tf.f = nil
	}
	tf.pending = 0
}

func (s *dirSink) flush() error {
	var errs []error
	for _, tf := range s.dirty {
		tf.dirty = false
		if tf.f == nil {
			continue
		}
		if err := tf.w.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("audit: flush %s: %w", tf.dir, err))
			s.discard(tf)
			continue
		}
		s.written(tf.pending)
		tf.pending = 0
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	return errors.Join(errs...)
}

func (s *dirSink) close() error {
	var errs []error
	for _, tf := range s.open {
		errs = append(errs, s.closeFile(tf))
	}
	clear(s.open)
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	return errors.Join(errs...)
}

// closeFile flushes, syncs and closes tf's file, so a rotated or closed file is complete on disk.
func (s *dirSink) closeFile(tf *tenantFile) error {
	if tf.f == nil {
		return nil
	}
	f := tf.f
	tf.f = nil
	flushErr := tf.w.Flush()
	if flushErr == nil {
		s.written(tf.pending)
	}
	tf.pending = 0
	if err := errors.Join(flushErr, f.Sync(), f.Close()); err != nil {
		return fmt.Errorf("audit: close %s: %w", tf.dir, err)
	}
	return nil
}
