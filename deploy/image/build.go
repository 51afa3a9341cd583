package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"gopkg.in/yaml.v3"
)

// nonroot is the user and group the image runs as (distroless's nonroot).
const nonroot = 65532

// binaryPath is where the image holds infergate, and its entrypoint.
const binaryPath = "/infergate"

// Spec is what an image build needs.
type Spec struct {
	Root       string   // the repository's root (holds go.mod and cmd/infergate)
	Repository string   // e.g. ghcr.io/infergate/infergate
	Version    string   // stamped into the binary and the labels
	Revision   string   // the commit
	Source     string   // the repository's URL
	Platforms  []string // linux/amd64, linux/arm64
	Created    time.Time
}

// chartDefaults reads the chart's image repository and appVersion, which the image's defaults follow: the chart
// installs the image this builds.
func chartDefaults(root string) (repository, version string, err error) {
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
		} `yaml:"image"`
	}
	for _, f := range []struct {
		name string
		into any
	}{{"Chart.yaml", &chart}, {"values.yaml", &values}} {
		b, err := os.ReadFile(filepath.Join(root, "deploy/helm/infergate", f.name))
		if err != nil {
			return "", "", err
		}
		if err := yaml.Unmarshal(b, f.into); err != nil {
			return "", "", fmt.Errorf("%s: %w", f.name, err)
		}
	}
	if chart.AppVersion == "" || values.Image.Repository == "" {
		return "", "", fmt.Errorf("the chart names no appVersion or image.repository")
	}
	return values.Image.Repository, chart.AppVersion, nil
}

// Build compiles infergate for each platform and writes a multi-platform OCI image layout to out.
func Build(s Spec, out string) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, platform := range s.Platforms {
		img, err := s.image(platform)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platform, err)
		}
		p, err := v1.ParsePlatform(platform)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	idx = mutate.Annotations(idx, s.labels()).(v1.ImageIndex)
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	lp, err := layout.Write(out, empty.Index)
	if err != nil {
		return nil, err
	}
	ref := s.Repository + ":" + s.Version
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return nil, err
	}
	return idx, nil
}

// labels are the OCI labels (and the index's annotations).
func (s Spec) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "infergate",
		"org.opencontainers.image.description": "An Envoy ext_proc router for LLM fleets: KV-cache affinity, quotas, SLO placement, rollouts.",
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
}

// image builds one platform's image: the static binary and the few files a non-root process expects, nothing
// else (no shell, no package manager).
func (s Spec) image(platform string) (v1.Image, error) {
	goos, goarch, ok := strings.Cut(platform, "/")
	if !ok || goos != "linux" {
		return nil, fmt.Errorf("want linux/<arch>, got %q", platform)
	}
	bin, err := s.compile(goarch)
	if err != nil {
		return nil, err
	}
	fs, err := rootFS(bin, s.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(fs)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = goos, goarch
	cfg.Created = v1.Time{Time: s.Created}
	cfg.Config.User = fmt.Sprintf("%d:%d", nonroot, nonroot)
	cfg.Config.Entrypoint = []string{binaryPath}
	cfg.Config.Cmd = []string{"serve"}
	cfg.Config.WorkingDir = "/home/nonroot"
	cfg.Config.Env = []string{"HOME=/home/nonroot"}
	cfg.Config.Labels = s.labels()
	return mutate.ConfigFile(img, cfg)
}

// compile builds a static infergate for goarch, stamped with the version, carrying fallback CA roots.
func (s Spec) compile(goarch string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "infergate-image")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "infergate")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "fallbackroots", "-ldflags", "-s -w -X main.version="+s.Version,
		"-o", out, "./cmd/infergate")
	cmd.Dir = s.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, b)
	}
	return os.ReadFile(out)
}

// rootFS is the image's one layer: the binary, /etc/passwd and /etc/group naming root and nonroot, the
// nonroot home and /tmp.
func rootFS(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := []struct {
		name     string
		mode     int64
		uid      int
		body     []byte
		isDir    bool
		typeflag byte
	}{
		{name: "etc/", mode: 0o755, isDir: true},
		{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "home/", mode: 0o755, isDir: true},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot, isDir: true},
		{name: "tmp/", mode: 0o1777, isDir: true},
		{name: strings.TrimPrefix(binaryPath, "/"), mode: 0o755, body: bin},
	}
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.isDir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
