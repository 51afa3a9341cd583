package policies

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Store holds the live policy and replaces it on reload. A reload that fails validation leaves the previous
// snapshot in place: a typo in a ConfigMap must never take the fleet down.
type Store struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[Snapshot]

	mu           sync.Mutex // serialises reloads
	reloadsOK    atomic.Uint64
	reloadsFail  atomic.Uint64
	lastReloadOK atomic.Bool
	subscribers  []func(*Snapshot)

	watchingOnce sync.Once
	watching     chan struct{} // closed once Watch has registered with the file system
}

// NewStore loads the policy at path; the first load must succeed, since there is no good policy to keep yet.
// Reloads are logged to log (nil: nowhere).
func NewStore(path string, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	snap, err := LoadFile(path)
	if err != nil {
		return nil, err
	}
	s := &Store{path: path, log: log, watching: make(chan struct{})}
	s.cur.Store(snap)
	s.lastReloadOK.Store(true)
	return s, nil
}

// NewStaticStore serves a fixed snapshot; tests and tools use it where there is no file to watch.
func NewStaticStore(snap *Snapshot) *Store {
	s := &Store{log: slog.New(slog.DiscardHandler), watching: make(chan struct{})}
	s.cur.Store(snap)
	s.lastReloadOK.Store(true)
	return s
}

// Watching is closed once Watch has registered with the file system: a change written after it is seen.
func (s *Store) Watching() <-chan struct{} { return s.watching }

// Current returns the live snapshot. It never returns nil.
func (s *Store) Current() *Snapshot { return s.cur.Load() }

// OnChange registers a function called with each newly installed snapshot (for example to rebuild xDS).
func (s *Store) OnChange(fn func(*Snapshot)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subscribers = append(s.subscribers, fn)
}

// ReloadStats reports successful and failed reloads, and whether the last attempt succeeded.
func (s *Store) ReloadStats() (ok, failed uint64, lastOK bool) {
	return s.reloadsOK.Load(), s.reloadsFail.Load(), s.lastReloadOK.Load()
}

// Reload re-reads the file. On error the current snapshot stays and the error is returned.
func (s *Store) Reload() error {
	if s.path == "" {
		return errors.New("policy store has no file to reload")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	snap, err := LoadFile(s.path)
	if err != nil {
		s.reloadsFail.Add(1)
		s.lastReloadOK.Store(false)
		s.log.Error("policy reload rejected; keeping the last good policy",
			"path", s.path, "kept_version", s.Current().Version, "err", err)
		return err
	}
	old := s.Current()
	s.reloadsOK.Add(1)
	s.lastReloadOK.Store(true)
	if old.Version == snap.Version {
		return nil
	}
	s.cur.Store(snap)
	s.log.Info("policy reloaded", "path", s.path, "old_version", old.Version, "version", snap.Version)
	for _, fn := range s.subscribers {
		fn(snap)
	}
	return nil
}

// Watch reloads the policy whenever its file changes, until ctx ends. It watches the directory rather than the
// file, because editors and Kubernetes ConfigMaps replace files by rename (the ..data symlink swap), which a
// watch on the file itself would lose. Bursts of events are coalesced for debounce.
func (s *Store) Watch(ctx context.Context, debounce time.Duration) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch policy: %w", err)
	}
	defer w.Close()
	dir := filepath.Dir(s.path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch policy directory %s: %w", dir, err)
	}
	s.watchingOnce.Do(func() { close(s.watching) })
	base := filepath.Base(s.path)
	var timer *time.Timer
	var fire <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			name := filepath.Base(ev.Name)
			if name != base && name != "..data" {
				continue
			}
			if timer == nil {
				timer = time.NewTimer(debounce)
			} else {
				timer.Reset(debounce)
			}
			fire = timer.C
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			s.log.Warn("policy watch error", "err", err)
		case <-fire:
			fire = nil
			_ = s.Reload() // logged and counted inside
		}
	}
}
