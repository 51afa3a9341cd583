// Package regionnet runs regions as Linux network namespaces for infergate's region tests: each region a
// namespace with its gateway, engines and data plane, joined by veth pairs through a "wan" namespace that
// routes between them, and between every pair of regions a Toxiproxy proxy (in the caller's region, for each
// service of the other) that adds the round trip and cuts the link on demand. These machines' kernels have no
// netem, and a proxy is what lets one region see another far away while its own services stay near.
//
// Addresses: region i (from 1) reaches the wan over 198.18.i.2/24 (the wan's end is 198.18.i.1); its services
// listen on every address of their namespace and are named by 198.19.i.1 (a loopback alias). In another
// region that name is a loopback alias too, where that region's proxies listen, each forwarding to the
// service's wan address 198.18.i.2. The caller's namespace reaches the wan at 198.18.0.2 from 198.18.0.1, with
// a route to 198.18.0.0/15. These are the benchmarking range (RFC 2544): test hosts of this package's own
// namespaces, never another machine.
package regionnet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strings"
)

// Net is a set of region namespaces and the wan between them.
type Net struct {
	// Regions are the regions' names, in the order of their index (region i is Regions[i-1]).
	Regions []string
	prefix  string
	created []string // namespaces, for Close
	links   []string // veth ends in the caller's namespace, for Close
}

// ip runs one ip(8) command.
func ip(ctx context.Context, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Supported says whether this machine lets the caller make network namespaces (root, and ip(8)).
func Supported(ctx context.Context) error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("ip(8) not found: %w", err)
	}
	n, err := New(ctx, nil)
	if err != nil {
		return err
	}
	n.Close()
	return nil
}

// New makes the wan namespace and one namespace per region, each joined to the wan, and joins the caller's
// namespace to the wan. Close removes everything. The namespaces' names carry a random part, so that runs never
// meet; those of a run that died without Close (no process left in any of them) are removed first.
func New(ctx context.Context, regions []string) (_ *Net, err error) {
	sweep(ctx)
	var id [3]byte
	_, _ = rand.Read(id[:])
	n := &Net{Regions: regions, prefix: "igr" + hex.EncodeToString(id[:])}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	wan := n.prefix + "-wan"
	if err := n.namespace(ctx, wan); err != nil {
		return nil, err
	}
	if err := ip(ctx, "netns", "exec", wan, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); err != nil {
		// sysctl(8) may be missing: the file does the same.
		if err := ip(ctx, "netns", "exec", wan, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
			return nil, err
		}
	}
	host := n.prefix + "h"
	if err := n.veth(ctx, host, "", wan, "198.18.0.1/24", "198.18.0.2/24"); err != nil {
		return nil, err
	}
	if err := ip(ctx, "route", "replace", "198.18.0.0/15", "via", "198.18.0.2", "dev", host); err != nil {
		return nil, err
	}
	for i, r := range regions {
		ns := n.Namespace(r)
		if err := n.namespace(ctx, ns); err != nil {
			return nil, err
		}
		if err := n.veth(ctx, fmt.Sprintf("%sw%d", n.prefix, i+1), wan, ns, fmt.Sprintf("198.18.%d.1/24", i+1), fmt.Sprintf("198.18.%d.2/24", i+1)); err != nil {
			return nil, err
		}
		if err := ip(ctx, "-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", i+1)); err != nil {
			return nil, err
		}
		if err := ip(ctx, "-n", wan, "route", "add", fmt.Sprintf("198.19.%d.0/24", i+1), "via", fmt.Sprintf("198.18.%d.2", i+1)); err != nil {
			return nil, err
		}
		// Every region's service name is a loopback alias in every region: its own services, or the proxies to
		// them.
		for j := range regions {
			if err := ip(ctx, "-n", ns, "addr", "add", ServiceIP(j+1)+"/32", "dev", "lo"); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

// namespace makes one namespace with its loopback up.
func (n *Net) namespace(ctx context.Context, ns string) error {
	if err := ip(ctx, "netns", "add", ns); err != nil {
		return err
	}
	n.created = append(n.created, ns)
	return ip(ctx, "-n", ns, "link", "set", "lo", "up")
}

// veth joins namespace a ("" for the caller's) and b with a veth pair named name (and name+"p"), addressed
// addrA and addrB.
func (n *Net) veth(ctx context.Context, name, a, b, addrA, addrB string) error {
	peer := name + "p"
	if err := ip(ctx, "link", "add", name, "type", "veth", "peer", "name", peer); err != nil {
		return err
	}
	if a == "" {
		n.links = append(n.links, name)
	} else if err := ip(ctx, "link", "set", name, "netns", a); err != nil {
		return err
	}
	if err := ip(ctx, "link", "set", peer, "netns", b); err != nil {
		return err
	}
	for _, end := range []struct{ ns, dev, addr string }{{a, name, addrA}, {b, peer, addrB}} {
		pre := []string{}
		if end.ns != "" {
			pre = []string{"-n", end.ns}
		}
		if err := ip(ctx, append(pre, "addr", "add", end.addr, "dev", end.dev)...); err != nil {
			return err
		}
		if err := ip(ctx, append(pre, "link", "set", end.dev, "up")...); err != nil {
			return err
		}
	}
	return nil
}

// Namespace is a region's namespace.
func (n *Net) Namespace(region string) string { return n.prefix + "-" + region }

// Index is a region's index (from 1), 0 when the net has no such region.
func (n *Net) Index(region string) int {
	for i, r := range n.Regions {
		if r == region {
			return i + 1
		}
	}
	return 0
}

// ServiceIP is the name of region i's services: the address its policy entries use.
func ServiceIP(i int) string { return fmt.Sprintf("198.19.%d.1", i) }

// WanIP is region i's address on the wan: where its services are reached from elsewhere.
func WanIP(i int) string { return fmt.Sprintf("198.18.%d.2", i) }

// Command is name run in a region's namespace.
func (n *Net) Command(ctx context.Context, region, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Namespace(region), name}, args...)...)
}

// Close removes the namespaces and the caller's veth ends (their routes go with them).
func (n *Net) Close() {
	ctx := context.Background()
	for _, l := range n.links {
		_ = ip(ctx, "link", "del", l)
	}
	for i := len(n.created) - 1; i >= 0; i-- {
		_ = ip(ctx, "netns", "del", n.created[i])
	}
}

// sweep removes the namespaces of earlier runs that died without Close: every namespace of a run's prefix, when
// no process is left in any of them.
func sweep(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	runs := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if prefix, _, ok := strings.Cut(name, "-"); ok && strings.HasPrefix(prefix, "igr") && len(prefix) == 9 {
			runs[prefix] = append(runs[prefix], name)
		}
	}
	for _, names := range runs {
		busy := false
		for _, ns := range names {
			pids, err := exec.CommandContext(ctx, "ip", "netns", "pids", ns).Output()
			busy = busy || err != nil || len(bytes.TrimSpace(pids)) > 0
		}
		if !busy {
			for _, ns := range names {
				_ = ip(ctx, "netns", "del", ns)
			}
		}
	}
}
