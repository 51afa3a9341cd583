package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/test/envoysim"
)

// stack is everything the chaos suite runs: a simulated fleet and a plain-HTTP managed API in process,
// redis-server and infergate as real processes (so they can be killed, stopped and restarted), and the
// Envoy-faithful data plane configured by infergate over xDS (deploy/envoy/envoy-xds.yaml).
type stack struct {
	dir, root string
	log       *slog.Logger

	fleet *fleetsim.Fleet
	url   string // the data plane

	redis     *proc
	redisAddr string
	// messageKey signs what replicas share over Redis (--redis-message-key-file at messageKeyPath).
	messageKey     []byte
	messageKeyPath string

	gateway                           *proc
	infergateBin                      string
	extprocAddr, xdsAddr, metricsAddr string
	policyPath                        string
	failMode                          string
	crashes                           int // infergate exits nobody asked for
	mu                                sync.Mutex
	expectExit                        bool
	replicas                          map[string]*fleetsim.Replica
	llamaPool, qwenPool               []string
	steadyKey, meteredKey             string
	meteredTPM, steadyConcurrency     int64
	upstreamIdle                      time.Duration
}

// proc is one child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(name string, args []string, env []string, logFile string) (*proc, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); out.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// freeAddr finds a free loopback port (bound and released: on loopback the race is harmless).
func freeAddr() (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer lis.Close()
	return lis.Addr().String(), nil
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// startStack brings everything up.
func startStack(ctx context.Context, root, dir string, log *slog.Logger) (*stack, error) {
	s := &stack{dir: dir, root: root, log: log, failMode: "open", replicas: map[string]*fleetsim.Replica{},
		steadyKey: "sk-chaos-steady", meteredKey: "sk-chaos-metered", meteredTPM: 6000, steadyConcurrency: 24,
		upstreamIdle: 3 * time.Second}
	cfg := fleetsim.Config{TimeScale: 0.05}
	for _, r := range []struct{ name, model string }{
		{"llama-0", "llama-served"}, {"llama-1", "llama-served"}, {"qwen-0", "qwen-served"}, {"qwen-1", "qwen-served"},
		{"managed", "llama-managed"},
	} {
		cfg.Replicas = append(cfg.Replicas, fleetsim.ReplicaConfig{Name: r.name, Addr: "127.0.0.1:0", Model: r.model,
			Hardware: "h200", NumGPUBlocks: 4096, MaxNumSeqs: 256, MaxTokensDefault: 600})
	}
	fleet, err := fleetsim.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s.fleet = fleet
	for _, r := range fleet.Replicas {
		s.replicas[r.Name()] = r
	}
	s.llamaPool = []string{s.replicas["llama-0"].Addr(), s.replicas["llama-1"].Addr()}
	s.qwenPool = []string{s.replicas["qwen-0"].Addr(), s.replicas["qwen-1"].Addr()}

	if s.redisAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if err := s.startRedis(); err != nil {
		return nil, err
	}
	if err := s.writeMessageKey(); err != nil {
		return nil, err
	}
	for _, a := range []*string{&s.extprocAddr, &s.xdsAddr, &s.metricsAddr} {
		if *a, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	s.policyPath = filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(s.policyPath, []byte(s.policy()), 0o644); err != nil {
		return nil, err
	}
	s.infergateBin = filepath.Join(dir, "infergate")
	build := exec.Command("go", "build", "-o", s.infergateBin, "./cmd/infergate")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build infergate: %w", err)
	}
	if err := s.startGateway(); err != nil {
		return nil, err
	}

	ecfg, err := envoysim.LoadFile(filepath.Join(root, "deploy/envoy/envoy-xds.yaml"))
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = ecfg.FetchADS(fctx, s.xdsAddr)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("data plane xDS: %w", err)
	}
	dp, err := envoysim.New(ecfg, envoysim.Options{ExtProcAddr: s.extprocAddr, Logger: log})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = dp.Serve(ctx, lis); dp.Close() }()
	s.url = "http://" + lis.Addr().String()
	return s, nil
}

// policy is the policy file: llama with a managed fallback, qwen without; a steady tenant with a concurrency
// limit and a metered one with a tokens-per-minute limit.
func (s *stack) policy() string {
	return fmt.Sprintf(`apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  gateway: {defaultMaxTokens: 32, upstreamIdleTimeout: %s}
  quotas: {failMode: %s, redisTimeout: 50ms, gatewayReplicas: 1}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
  models:
  - name: llama
    pricing: {inputPerMTok: 0.2, outputPerMTok: 0.6}
    pools:
    - {name: h200, hardwareClass: h200, engine: vllm, servedModel: llama-served, endpoints: [%q, %q]}
    fallbacks:
    - {name: managed, baseURL: "http://%s/v1", model: llama-managed, apiKeyFrom: "env:CHAOS_MANAGED_KEY", when: [saturated, unavailable]}
  - name: qwen
    pools:
    - {name: l40s, hardwareClass: h200, engine: vllm, servedModel: qwen-served, endpoints: [%q, %q]}
  tenants:
  - {name: steady, apiKeys: [%q], models: ["*"], quota: {maxConcurrent: %d}}
  - {name: metered, apiKeys: [%q], models: ["*"], quota: {tokensPerMinute: %d}}
`, s.upstreamIdle, s.failMode, s.llamaPool[0], s.llamaPool[1], s.replicas["managed"].Addr(), s.qwenPool[0], s.qwenPool[1],
		keyHash(s.steadyKey), s.steadyConcurrency, keyHash(s.meteredKey), s.meteredTPM)
}

func (s *stack) startRedis() error {
	_, port, _ := net.SplitHostPort(s.redisAddr)
	p, err := startProc("redis-server", []string{"--port", port, "--bind", "127.0.0.1", "--dir", s.dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no", "--loglevel", "warning"}, nil,
		filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return err
	}
	s.redis = p
	return waitFor(10*time.Second, "redis-server", func() bool {
		c, err := net.DialTimeout("tcp", s.redisAddr, 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (s *stack) startGateway() error {
	args := []string{"serve", "--policy", s.policyPath, "--redis-addr", s.redisAddr, "--extproc-addr", s.extprocAddr,
		"--xds-addr", s.xdsAddr, "--metrics-addr", s.metricsAddr, "--scrape-interval", "100ms", "--drain-timeout", "10s",
		"--instance-id", "chaos-gateway", "--admin-addr", "", "--audit-log", filepath.Join(s.dir, "audit"),
		"--redis-message-key-file", s.messageKeyPath}
	p, err := startProc(s.infergateBin, args, []string{"CHAOS_MANAGED_KEY=chaos-managed-key"}, filepath.Join(s.dir, "infergate.log"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.gateway, s.expectExit = p, false
	s.mu.Unlock()
	go func() {
		<-p.done
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.expectExit && s.gateway == p {
			s.crashes++
			s.log.Error("infergate exited unexpectedly", "err", p.err)
		}
	}()
	return waitFor(20*time.Second, "infergate", func() bool { return httpOK("http://" + s.metricsAddr + "/readyz") })
}

// stopGateway signals infergate and waits for it to exit.
func (s *stack) stopGateway(sig syscall.Signal) {
	s.mu.Lock()
	s.expectExit = true
	p := s.gateway
	s.mu.Unlock()
	p.signal(sig)
	<-p.done
}

// gatewayPeakRSS is the running infergate's peak resident memory (VmHWM), 0 when it cannot be read.
func (s *stack) gatewayPeakRSS() int64 {
	s.mu.Lock()
	pid := s.gateway.cmd.Process.Pid
	s.mu.Unlock()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				kib, _ := strconv.ParseInt(f[0], 10, 64)
				return kib << 10
			}
		}
	}
	return 0
}

func (s *stack) gatewayAlive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.gateway.exited()
}

func (s *stack) crashCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}

// setPolicy writes the policy file and waits until infergate has loaded it (or, for a broken one, refused
// it).
func (s *stack) setPolicy(text string, wantLoaded bool) error {
	before := s.metric("infergate_policy_reloads_total", `result="ok"`)
	rejected := s.metric("infergate_policy_reloads_total", `result="rejected"`)
	tmp := s.policyPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.policyPath); err != nil {
		return err
	}
	return waitFor(10*time.Second, "policy reload", func() bool {
		if wantLoaded {
			return s.metric("infergate_policy_reloads_total", `result="ok"`) > before
		}
		return s.metric("infergate_policy_reloads_total", `result="rejected"`) > rejected
	})
}

// metric sums infergate's series of the named metric that carry label (`name="value"`; "" for every series), as
// prometheus/common's text parser reads /metrics; -1 when there is none or /metrics does not answer.
func (s *stack) metric(name, label string) float64 {
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil || fams[name] == nil {
		return -1
	}
	key, quoted, _ := strings.Cut(label, "=")
	value, _ := strconv.Unquote(quoted)
	total, found := 0.0, false
	for _, m := range fams[name].GetMetric() {
		if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == key && l.GetValue() == value }) {
			continue
		}
		found = true
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	if !found {
		return -1
	}
	return total
}

func httpOK(url string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitFor polls cond until it holds or the limit passes.
func waitFor(limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for " + what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
