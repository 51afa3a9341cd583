package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunRefusesBadInput(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"--fleet", "does-not-exist.yaml"}, &out, &errOut); code != 1 {
		t.Errorf("missing fleet file: exit %d", code)
	}
	if !strings.Contains(errOut.String(), "infergate-sim:") {
		t.Errorf("stderr %q", errOut.String())
	}
	if code := run(context.Background(), []string{"--bogus"}, &out, &errOut); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
}
