package regionnet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a process of the fleet, run in a region's namespace (or the caller's): it dies with the caller
// (SIGKILL when the caller's thread ends, and its standard input closes), and its output goes to a log file.
type Proc struct {
	Name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	log   string
}

// start runs cmd as a Proc, its output in logPath; ready, when set, is a line the process prints on standard
// output once it serves, waited for up to wait.
func start(name string, cmd *exec.Cmd, logPath, ready string, wait time.Duration) (*Proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		logf.Close()
		return nil, err
	}
	var lines chan string
	if ready != "" {
		out, err := cmd.StdoutPipe()
		if err != nil {
			logf.Close()
			return nil, err
		}
		lines = make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.TrimSpace(sc.Text()) == ready {
					lines <- ready
				}
				fmt.Fprintln(logf, sc.Text())
			}
		}()
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	if lines == nil {
		return p, nil
	}
	select {
	case <-lines:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready; its log: %s", name, tail(logPath))
	case <-time.After(wait):
		p.Kill()
		return nil, fmt.Errorf("%s not ready after %v; its log: %s", name, wait, tail(logPath))
	}
}

// Kill ends the process at once and waits for it.
func (p *Proc) Kill() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to end (SIGTERM), then kills it after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Exited says whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log is the tail of the process's log, for failure messages.
func (p *Proc) Log() string { return tail(p.log) }

func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// waitDial waits until addr accepts a connection.
func waitDial(ctx context.Context, addr string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		conn, err := (&net.Dialer{Timeout: 200 * time.Millisecond}).DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not accept connections after %v: %w", addr, wait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
