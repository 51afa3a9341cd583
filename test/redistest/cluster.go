package redistest

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RealCluster is a Redis Cluster of several processes: masters with a replica each, slots spread by
// redis-cli --cluster create, failover after a one-second node timeout.
type RealCluster struct {
	t     testing.TB
	Nodes []*Server
}

// StartRealCluster starts masters × 2 redis-server processes on free loopback ports and forms a cluster of
// masters with one replica each; it returns once every node sees every slot served and every replica has
// its master's dataset (a master killed before then fails over to an empty replica, and its data is lost).
func StartRealCluster(t testing.TB, masters int) *RealCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatal("redis-cli is not installed; `make test` installs it with redis-server (scripts/ensure-test-deps.sh)")
	}
	c := &RealCluster{t: t}
	var addrs []string
	for range 2 * masters {
		s := startWith(t, &Server{t: t, cluster: true, member: true})
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy()
	c.waitReplicated()
	return c
}

// waitReplicated waits until every replica's link to its master is up: its first sync is done.
func (c *RealCluster) waitReplicated() {
	c.t.Helper()
	c.untilEveryLiveNode("the cluster's replicas did not sync", func(n *Server) bool {
		info, err := n.Do("INFO", "replication")
		return err == nil && (!strings.Contains(info, "role:slave") || strings.Contains(info, "master_link_status:up"))
	})
}

// WaitCaughtUp waits until master's replicas have acknowledged everything it had written when called (they
// acknowledge about once a second): a master killed then loses nothing to asynchronous replication, so a
// test of failing over is not one of Redis losing acknowledged writes, which a busy machine's lagging replica
// makes likely.
func (c *RealCluster) WaitCaughtUp(master *Server) {
	c.t.Helper()
	info, err := master.Do("INFO", "replication")
	if err != nil {
		c.t.Fatal(err)
	}
	target := replicationField(info, "master_repl_offset:")
	c.untilEveryLiveNode("the replicas did not catch up", func(n *Server) bool {
		if n != master {
			return true
		}
		info, err := n.Do("INFO", "replication")
		if err != nil {
			return false
		}
		for line := range strings.SplitSeq(info, "\n") {
			if strings.HasPrefix(line, "slave") && strings.Contains(line, "offset=") {
				_, rest, _ := strings.Cut(line, "offset=")
				off, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				if off < target {
					return false
				}
			}
		}
		return true
	})
}

// replicationField reads an integer field of INFO replication.
func replicationField(info, field string) int64 {
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), field); ok {
			n, _ := strconv.ParseInt(rest, 10, 64)
			return n
		}
	}
	return 0
}

// Addrs are every node's address (a cluster client discovers the rest from any of them).
func (c *RealCluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr)
	}
	return out
}

// WaitHealthy waits until every live node reports the cluster ok with all slots served by live masters.
func (c *RealCluster) WaitHealthy() {
	c.t.Helper()
	c.untilEveryLiveNode("the cluster did not become healthy", func(n *Server) bool {
		info, err := n.Do("CLUSTER", "INFO")
		return err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384")
	})
}

// untilEveryLiveNode polls every live node until ok holds of all of them, failing the test with failure after
// 30 s.
func (c *RealCluster) untilEveryLiveNode(failure string, ok func(n *Server) bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		all := true
		for _, n := range c.Nodes {
			if n.cmd != nil && !ok(n) {
				all = false
				break
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatal(failure + " within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MasterOf returns the live node that is master of a key's slot, as the first live node sees it.
func (c *RealCluster) MasterOf(key string) *Server {
	c.t.Helper()
	for _, n := range c.Nodes {
		if n.cmd == nil {
			continue
		}
		slotText, err := n.Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			continue
		}
		slot, _ := strconv.Atoi(slotText)
		nodes, err := n.Do("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			addr := strings.SplitN(f[1], "@", 2)[0]
			for _, r := range f[8:] {
				lo, hi, _ := strings.Cut(r, "-")
				a, errA := strconv.Atoi(lo)
				b, errB := strconv.Atoi(hi)
				if hi == "" {
					b, errB = a, errA
				}
				if errA == nil && errB == nil && slot >= a && slot <= b {
					for _, s := range c.Nodes {
						if s.Addr == addr {
							return s
						}
					}
				}
			}
		}
	}
	c.t.Fatalf("no master for %s", key)
	return nil
}
