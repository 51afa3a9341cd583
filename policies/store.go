package policies

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	data         []byte     // the last good file, which Refresh resolves again
	resolver     EndpointResolver
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
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	snap, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	s := &Store{path: path, log: log, watching: make(chan struct{}), data: data}
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
	data, err := os.ReadFile(s.path)
	var snap *Snapshot
	if err == nil {
		snap, err = ParseResolved(s.path, data, s.resolver)
	}
	if err != nil {
		s.reloadsFail.Add(1)
		s.lastReloadOK.Store(false)
		s.log.Error("policy reload rejected; keeping the last good policy",
			"path", s.path, "kept_version", s.Current().Version, "err", err)
		return err
	}
	s.data = data
	s.reloadsOK.Add(1)
	s.lastReloadOK.Store(true)
	s.install(snap, "policy reloaded")
	return nil
}

// install swaps a snapshot in and tells the subscribers, unless it is the one in force. Call with mu held.
func (s *Store) install(snap *Snapshot, why string) {
	old := s.Current()
	if old.Version == snap.Version {
		return
	}
	s.cur.Store(snap)
	s.log.Info(why, "path", s.path, "old_version", old.Version, "version", snap.Version)
	for _, fn := range s.subscribers {
		fn(snap)
	}
}

// SetResolver makes the store fill discovered pools' endpoints from r, now (Refresh) and at every reload.
func (s *Store) SetResolver(r EndpointResolver) {
	s.mu.Lock()
	s.resolver = r
	s.mu.Unlock()
	s.Refresh()
}

// Refresh resolves the last good policy's discovered endpoints again (the resolver saw a change) and installs
// the result when they moved. It cannot fail: the file was valid when it was read.
func (s *Store) Refresh() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return
	}
	snap, err := ParseResolved(s.path, s.data, s.resolver)
	if err != nil {
		s.log.Error("discovered endpoints could not be applied", "err", err) // the file was valid: unreachable
		return
	}
	s.install(snap, "pool endpoints changed")
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
