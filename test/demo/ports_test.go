package main

import (
	"net"
	"strings"
	"testing"

	"github.com/infergate/infergate/test/e2e"
)

// A port someone else holds stops the demo with one line naming it.
func TestCheckPortsNamesTheBusyOne(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	err = checkPorts([]string{freeAddr, held.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), held.Addr().String()) || strings.Contains(err.Error(), freeAddr) {
		t.Fatalf("err = %v, want one naming only %s", err, held.Addr())
	}
	if err := checkPorts([]string{freeAddr}); err != nil {
		t.Errorf("a free port refused: %v", err)
	}
}

// The demo checks every listener it will open: the fleet's, infergate's and the data plane's.
func TestDemoPortsCoverEveryListener(t *testing.T) {
	root, err := e2e.FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := demoPorts(root, fleetFile, "127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"127.0.0.1:18101", "127.0.0.1:18443", "127.0.0.1:18099", extprocAddr, metricsAddr, "127.0.0.1:8080"} {
		found := false
		for _, a := range addrs {
			found = found || a == want
		}
		if !found {
			t.Errorf("%s not checked (%v)", want, addrs)
		}
	}
}
