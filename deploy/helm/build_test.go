package helm

import (
	"os/exec"
	"strings"
	"testing"
)

// The chart's tests build with the race detector, as the gateway's do, so that make test compiles the ~900
// packages they share once (3 1/2 min of a cold run): that holds only while every module both builds use has
// one version in both. A dependency bump in either module that breaks it fails here, naming the modules to
// align (go get <module>@<version> in the module with the older one).
func TestSharesTheGatewaysBuild(t *testing.T) {
	const format = "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}"
	ours := modules(t, ".", "list", "-deps", "-test", "-f", format, "./...")
	gateway := modules(t, "../..", "list", "-deps", "-test", "-f", format, "./...")
	shared := 0
	for path, version := range ours {
		theirs, ok := gateway[path]
		if !ok {
			continue
		}
		shared++
		if theirs != version {
			t.Errorf("%s: %s here, %s in the gateway's module", path, version, theirs)
		}
	}
	if shared < 30 {
		t.Errorf("only %d of the chart tests' %d modules build in the gateway's tests too; expected most", shared, len(ours))
	}
}

// modules runs go with args in dir and reads its "path version" lines.
func modules(t *testing.T, dir string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args[:2], " "), err)
	}
	found := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			found[path] = version
		}
	}
	return found
}
