package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/infergate/infergate/fleetsim"
)

// The demo binds fixed loopback ports (the quickstart files name them). Another program — often a second
// `make demo` — may hold one; the demo must then stop before it starts anything, rather than have its health
// checks answered by a stranger and send traffic to a fleet it did not start.

// demoPorts lists every address the demo will listen on: the simulated fleet's (from its file), infergate's
// ext_proc, metrics and xDS, and the data plane.
func demoPorts(root, fleetFile, listen string) ([]string, error) {
	cfg, err := fleetsim.LoadConfig(filepath.Join(root, fleetFile))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range cfg.Replicas {
		out = append(out, r.Addr)
	}
	for _, m := range cfg.Managed {
		out = append(out, m.Addr)
	}
	if cfg.AdminAddr != "" {
		out = append(out, cfg.AdminAddr)
	}
	return append(out, extprocAddr, metricsAddr, xdsAddr, adminAddr, listen), nil
}

// checkPorts binds each address once and releases it; the first that cannot be bound is named in the error,
// with how to find what holds it.
func checkPorts(addrs []string) error {
	var busy []string
	for _, a := range addrs {
		lis, err := net.Listen("tcp", a)
		if err != nil {
			busy = append(busy, a)
			continue
		}
		_ = lis.Close()
	}
	if len(busy) == 0 {
		return nil
	}
	_, port, _ := net.SplitHostPort(busy[0])
	return fmt.Errorf("%s already in use (another `make demo`?); the demo started nothing. Stop what holds it (`ss -ltnp 'sport = :%s'`) and run it again",
		strings.Join(busy, ", "), port)
}
