// Package redistest runs real redis-server processes for tests, on free 127.0.0.1 ports, stopped by t.Cleanup.
// `make test` installs redis-server from Debian's packages when it is missing.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server process.
type Server struct {
	t       testing.TB
	Addr    string
	dir     string
	cluster bool
	persist bool
	// member: a node of a multi-node cluster (RealCluster), which assigns the slots itself.
	member bool
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	// ExtraArgs are given to redis-server at the next Restart (e.g. --rename-command EVAL "" to refuse scripts).
	ExtraArgs []string
}

// Start runs a standalone server with persistence off.
func Start(t testing.TB) *Server { return start(t, false) }

// StartPersistent runs a standalone server that writes every command to its append-only file, so a Kill and
// Restart keep the data, as the persistence docs/request-path.md asks for does.
func StartPersistent(t testing.TB) *Server {
	t.Helper()
	return startWith(t, &Server{t: t, persist: true})
}

// StartCluster runs a one-node Redis Cluster that owns every slot: real cluster semantics (MOVED, CROSSSLOT,
// hash tags) on one process.
func StartCluster(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, cluster bool) *Server {
	t.Helper()
	return startWith(t, &Server{t: t, cluster: cluster})
}

func startWith(t testing.TB, s *Server) *Server {
	t.Helper()
	cluster := s.cluster
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed; `make test` installs it (scripts/ensure-test-deps.sh)")
	}
	s.dir = t.TempDir()
	// A free port can be taken between choosing it and redis-server binding it (other tests start servers
	// too), and a cluster node also needs its bus port, 10000 higher: a few tries on fresh ports.
	var err error
	for range 5 {
		if s.Addr, err = freePort(cluster); err == nil {
			_ = os.Remove(filepath.Join(s.dir, "nodes.conf")) // a failed try's node identity
			if err = s.launch(); err == nil {
				break
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	if cluster && !s.member {
		if _, err := s.Do("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			info, _ := s.Do("CLUSTER", "INFO")
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster did not become ok: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return s
}

// freePort picks a free loopback port; for a cluster node, one whose bus port (10000 higher) exists and is
// free too.
func freePort(cluster bool) (string, error) {
	for range 20 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := lis.Addr().(*net.TCPAddr)
		lis.Close()
		if !cluster {
			return addr.String(), nil
		}
		if addr.Port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", addr.Port+10000))
		if err != nil {
			continue
		}
		bus.Close()
		return addr.String(), nil
	}
	return "", fmt.Errorf("no free port pair for a cluster node")
}

// Restart starts the process again on the same address (after Kill).
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.launch(); err != nil {
		s.t.Fatal(err)
	}
}

// launch starts redis-server on s.Addr and waits for it to answer, or reports why it did not.
func (s *Server) launch() error {
	_, port, _ := net.SplitHostPort(s.Addr)
	aof := "no"
	if s.persist {
		aof = "yes"
	}
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", aof, "--appendfsync", "always",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning"}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	if s.member {
		// A dead master is failed over within about a second, and a replica's first sync starts at once (by
		// default a master waits 5 s for more replicas before it streams its dataset).
		args = append(args, "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0")
	}
	cmd := exec.Command("redis-server", append(args, s.ExtraArgs...)...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		if out, err := s.Do("PING"); err == nil && out == "PONG" {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited before answering (its port taken?)", s.Addr)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("redis-server on %s did not answer PING within 10 s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the process abruptly, as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
}

// Pause stops the process with SIGSTOP: connections stay open and nothing answers, as with a hung server.
func (s *Server) Pause() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process.
func (s *Server) Resume() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Do sends one command over a fresh connection (RESP) and returns the reply as text.
func (s *Server) Do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line, nil
}
