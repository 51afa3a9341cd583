package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/test/e2e"
	"github.com/infergate/infergate/test/envoysim"
)

// The starved rows hold each gateway to a fraction of one core, as a gateway sharing a busy node is: it runs as
// `infergate serve` in a child process with GOMAXPROCS=1, pinned to the machine's last CPU at a lower priority
// (nice) than a busy loop pinned to the same CPU, so that it gets about 1024 / (1024 + weight(nice)) of the
// core less whatever the busy loop leaves. The benchmark's own process (the fleet, the data planes and the load
// generator, which stand for other machines) keeps the other CPUs. The engines run at half speed in these rows.
var (
	starveNice     = flag.Int("starve-nice", 7, "the starved gateways' nice value beside the busy loop (7: about 17 % of the core)")
	starveSlowdown = 2.0 // the engines' slowdown in the starved rows (× the time scale)
)

// starvation is what a starved run holds: the busy loop, and the gateway binary it starts.
type starvation struct {
	bin  string
	cpu  string // the CPU the gateways and the busy loop share; "" on a machine of one CPU
	rest string // the CPUs the benchmark keeps
}

// newStarvation builds infergate into dir.
func newStarvation(root, dir string) (*starvation, error) {
	bin := filepath.Join(dir, "infergate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/infergate")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build infergate: %w", err)
	}
	s := &starvation{bin: bin}
	if n := runtime.NumCPU(); n > 1 {
		if _, err := exec.LookPath("taskset"); err == nil {
			s.cpu, s.rest = strconv.Itoa(n-1), fmt.Sprintf("0-%d", n-2)
		}
	}
	return s, nil
}

// begin moves the benchmark off the starved CPU and starts the busy loop on it, until ctx ends (then the
// benchmark has every CPU again).
func (s *starvation) begin(ctx context.Context) error {
	if s.cpu != "" {
		if err := s.pinSelf(s.rest); err != nil {
			return err
		}
		go func() { <-ctx.Done(); _ = s.pinSelf(fmt.Sprintf("0-%d", runtime.NumCPU()-1)) }()
	}
	hog := s.command(ctx, false, "sh", "-c", "while :; do :; done")
	if err := hog.Start(); err != nil {
		return fmt.Errorf("busy loop: %w", err)
	}
	go func() { _ = hog.Wait() }()
	return nil
}

// pinSelf sets every thread of this process onto cpus.
func (s *starvation) pinSelf(cpus string) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset: %w: %s", err, out)
	}
	return nil
}

// command is name pinned to the starved CPU (and niced when starved), killed with ctx and with this process.
func (s *starvation) command(ctx context.Context, starved bool, name string, args ...string) *exec.Cmd {
	var prefix []string
	if s.cpu != "" {
		prefix = append(prefix, "taskset", "-c", s.cpu)
	}
	if starved {
		prefix = append(prefix, "nice", "-n", strconv.Itoa(*starveNice))
	}
	all := append(prefix, name)
	cmd := exec.CommandContext(ctx, all[0], append(all[1:], args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// starvedGateway is one gateway child process and its data plane.
type starvedGateway struct {
	pid        int
	metricsURL string
	url        string
	exited     chan struct{}
}

// startGateway starts a starved `infergate serve` on policy with its data plane; both stop with ctx.
func (s *starvation) startGateway(ctx context.Context, root, policy string, logTo io.Writer) (*starvedGateway, error) {
	var addrs [3]string
	for i := range addrs {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs[i] = lis.Addr().String()
		lis.Close() // bound and released: on loopback the race is harmless
	}
	extproc, xds, metrics := addrs[0], addrs[1], addrs[2]
	cmd := s.command(ctx, true, s.bin, "serve", "--policy", policy, "--extproc-addr", extproc, "--xds-addr", xds,
		"--metrics-addr", metrics, "--admin-addr", "", "--scrape-interval", scrapeEvery.String(), "--log-level", "warn")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stdout, cmd.Stderr = logTo, logTo
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start infergate: %w", err)
	}
	g := &starvedGateway{pid: cmd.Process.Pid, metricsURL: "http://" + metrics + "/metrics", exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(g.exited) }()
	if err := waitReady(ctx, "http://"+metrics+"/readyz", g.exited); err != nil {
		return nil, err
	}
	ecfg, err := envoysim.LoadFile(filepath.Join(root, "deploy/envoy/envoy-xds.yaml"))
	if err != nil {
		return nil, err
	}
	if g.url, err = e2e.StartDataPlane(ctx, ecfg, extproc, xds, slog.New(slog.DiscardHandler)); err != nil {
		return nil, err
	}
	return g, nil
}

// waitReady polls url until it answers 200, the process exits or 30 s pass.
func waitReady(ctx context.Context, url string, exited <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("infergate exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling a child process's readiness
		}
	}
	return fmt.Errorf("infergate not ready after 30 s")
}

// gather reads the gateway's /metrics, uncompressed: gzip cost the starved gateway more CPU than rendering.
func (g *starvedGateway) gather() ([]*dto.MetricFamily, error) {
	req, err := http.NewRequest(http.MethodGet, g.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

// schedTimes is how long the process's threads have run on a CPU and waited on a run queue to (from
// /proc/<pid>/task/*/schedstat; threads that exited are not counted).
func schedTimes(pid int) (running, waiting time.Duration) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		r, _ := strconv.ParseInt(f[0], 10, 64)
		w, _ := strconv.ParseInt(f[1], 10, 64)
		running, waiting = running+time.Duration(r), waiting+time.Duration(w)
	}
	return running, waiting
}

// cpuShare is what the starved gateways had of a CPU during a window: the cores they used, and the share of
// the time they were ready to run that they ran.
type cpuShare struct {
	cores, share float64
	measured     bool
}

// cpuWatch measures the starved gateways' CPU from start to stop.
type cpuWatch struct {
	pids             []int
	at               time.Time
	running, waiting time.Duration
}

func startCPUWatch(reps []gatewayReplica) *cpuWatch {
	w := &cpuWatch{at: time.Now()}
	for _, r := range reps {
		if r.pid > 0 {
			w.pids = append(w.pids, r.pid)
			run, wait := schedTimes(r.pid)
			w.running, w.waiting = w.running+run, w.waiting+wait
		}
	}
	return w
}

func (w *cpuWatch) stop() cpuShare {
	if len(w.pids) == 0 {
		return cpuShare{}
	}
	var running, waiting time.Duration
	for _, pid := range w.pids {
		run, wait := schedTimes(pid)
		running, waiting = running+run, waiting+wait
	}
	running, waiting = running-w.running, waiting-w.waiting
	wall := time.Since(w.at)
	return cpuShare{cores: running.Seconds() / wall.Seconds() / float64(len(w.pids)),
		share: running.Seconds() / max(1e-9, (running+waiting).Seconds()), measured: true}
}
