package policies

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/test/wait"
)

// writeAtomically replaces a file by rename, as editors and Kubernetes ConfigMap updates do.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestStoreHotReloadKeepsLastGoodPolicy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	writeAtomically(t, path, basePolicy)
	store, err := NewStore(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	first := store.Current()
	var notified []*Snapshot
	changed := make(chan *Snapshot, 4)
	store.OnChange(func(s *Snapshot) { changed <- s })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watchDone := make(chan error, 1)
	go func() { watchDone <- store.Watch(ctx, 20*time.Millisecond) }()
	select {
	case <-store.Watching():
	case err := <-watchDone:
		t.Fatalf("watch ended before it started: %v", err)
	}

	// A broken policy is refused and counted; the old snapshot stays live.
	writeAtomically(t, path, strings.Replace(basePolicy, "engine: vllm", "engine: ollama", 1))
	wait.For(t, "rejected reload", func() bool { _, failed, _ := store.ReloadStats(); return failed >= 1 })
	if _, _, lastOK := store.ReloadStats(); lastOK {
		t.Error("lastOK is true after a rejected reload")
	}
	if store.Current() != first {
		t.Fatal("a rejected policy replaced the live one")
	}

	// A good change is installed and subscribers hear of it.
	writeAtomically(t, path, strings.Replace(basePolicy, "qwen-7b", "qwen2.5-7b", -1))
	wait.For(t, "installed reload", func() bool { return store.Current() != first })
	select {
	case s := <-changed:
		notified = append(notified, s)
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber not notified")
	}
	if _, ok := notified[0].Model("qwen2.5-7b"); !ok {
		t.Error("new snapshot lacks the renamed model")
	}
	if _, _, lastOK := store.ReloadStats(); !lastOK {
		t.Error("lastOK is false after a good reload")
	}
	cancel()
	if err := <-watchDone; err != nil {
		t.Fatal(err)
	}
}

func TestNewStoreRefusesInvalidFirstPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeAtomically(t, path, "kind: Policy\n")
	if _, err := NewStore(path, slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("NewStore accepted an invalid policy")
	}
}
