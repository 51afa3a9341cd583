package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// The image `make image` writes, built here for this machine's architecture only (the other is the same code
// with another GOARCH, and costs a second compile): its config runs infergate as nonroot with no shell, its
// labels name the source, revision and version, and the binary in its root filesystem is static and runs.
func TestImageRunsInfergateAsNonroot(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("the image is linux/%s; this machine runs %s", runtime.GOARCH, runtime.GOOS)
	}
	repo, version, err := chartDefaults("../..")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image")
	platform := "linux/" + runtime.GOARCH
	created := time.Unix(1764800000, 0).UTC()
	spec := Spec{Root: "../..", Repository: repo, Version: version, Revision: "0123abc", Source: "https://github.com/infergate/infergate",
		Platforms: []string{platform}, Created: created}
	first, err := Build(spec, out)
	if err != nil {
		t.Fatal(err)
	}
	// The same commit builds the same image: the digests of two builds agree.
	again, err := Build(spec, filepath.Join(t.TempDir(), "again"))
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := digest(t, first), digest(t, again); d1 != d2 {
		t.Errorf("two builds of one spec: %s and %s", d1, d2)
	}
	// Read it back as any OCI tool would: the layout's index, its one manifest for this platform.
	lp, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	outer, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	om, err := outer.IndexManifest()
	if err != nil || len(om.Manifests) != 1 || om.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != repo+":"+version {
		t.Fatalf("layout index %+v, %v: want one index named %s:%s", om, err, repo, version)
	}
	idx, err := outer.ImageIndex(om.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH {
		t.Fatalf("image index %+v, %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/infergate"}) || !slices.Equal(c.Cmd, []string{"serve"}) ||
		cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH || !cfg.Created.Time.Equal(created) {
		t.Errorf("config: user %q entrypoint %v cmd %v os %s/%s created %v", c.User, c.Entrypoint, c.Cmd, cfg.OS, cfg.Architecture, cfg.Created)
	}
	for k, want := range map[string]string{"org.opencontainers.image.source": "https://github.com/infergate/infergate",
		"org.opencontainers.image.revision": "0123abc", "org.opencontainers.image.version": version} {
		if c.Labels[k] != want {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], want)
		}
	}
	root := unpack(t, img)
	for _, shell := range []string{"bin/sh", "bin/bash", "bin/busybox", "usr/bin/env"} {
		if _, err := os.Lstat(filepath.Join(root, shell)); err == nil {
			t.Errorf("the image has %s", shell)
		}
	}
	bin := filepath.Join(root, "infergate")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary is dynamically linked: it needs an interpreter the image does not have")
		}
	}
	f.Close()
	got, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != "infergate "+version {
		t.Errorf("infergate version: %q, %v; want %q", got, err, "infergate "+version)
	}
}

// unpack extracts an image's flattened filesystem (regular files and directories; the image has nothing else)
// into a temporary directory, refusing any path that would leave it.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, h.Name)
		if !strings.HasPrefix(path, root+string(filepath.Separator)) {
			t.Fatalf("entry %q leaves the root", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			var b bytes.Buffer
			if _, err := io.Copy(&b, tr); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b.Bytes(), os.FileMode(h.Mode)&0o755); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("entry %q of type %c", h.Name, h.Typeflag)
		}
	}
	return root
}

func digest(t *testing.T, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
