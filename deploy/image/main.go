// Command image builds infergate's container image without a container runtime, as ko does: a static binary
// per platform in a layer of its own, run as nonroot (65532) with no shell, the OCI labels naming its source,
// revision and version, written as a multi-platform OCI image layout (`make image`). Push it with any OCI tool,
// e.g. `crane push bin/image ghcr.io/infergate/infergate:0.1.0` or `skopeo copy oci:bin/image docker://…`.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	root := flag.String("root", "../..", "the repository's root")
	out := flag.String("out", "../../bin/image", "where the OCI image layout is written")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms")
	version := flag.String("version", "", "the image's version (default: the chart's appVersion)")
	repository := flag.String("repository", "", "the image's repository (default: the chart's image.repository)")
	flag.Parse()
	if err := run(*root, *out, *platforms, *version, *repository); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(root, out, platforms, version, repository string) error {
	repo, appVersion, err := chartDefaults(root)
	if err != nil {
		return err
	}
	if version == "" {
		version = appVersion
	}
	if repository == "" {
		repository = repo
	}
	s := Spec{Root: root, Repository: repository, Version: version, Revision: revision(root), Source: "https://github.com/infergate/infergate",
		Platforms: strings.Split(platforms, ","), Created: created(root)}
	idx, err := Build(s, out)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(out)
	fmt.Printf("%s:%s (%s) → OCI layout %s, index %s\n", repository, version, platforms, abs, digest)
	return nil
}

// revision is the commit being built, "+dirty" when the tree has changes; "unknown" outside git.
func revision(root string) string {
	b, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(b))
	if err := exec.Command("git", "-C", root, "diff", "--quiet", "HEAD").Run(); err != nil {
		rev += "+dirty"
	}
	return rev
}

// created is SOURCE_DATE_EPOCH, else the commit's time, so that the same commit builds the same image.
func created(root string) time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	if b, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct").Output(); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Unix(0, 0).UTC()
}
