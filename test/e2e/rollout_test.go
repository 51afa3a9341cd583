package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/deploy/observability"
	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// rolloutLimit bounds the wait for a rollout to walk its steps: about five seconds on an idle machine.
const rolloutLimit = 90 * time.Second

// rolloutPolicy is examples/rollout/policy.yaml with steps of seconds instead of minutes: 30, 60 and 100 %
// of conversations, each at least step long and 15 candidate requests, judged once each arm has 20 requests
// in the step, without a warm-up; the gates' margins and confidence are the defaults.
func rolloutPolicy(t *testing.T, step time.Duration) string {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "examples/rollout/policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	start, end := strings.Index(src, "      steps:\n"), strings.Index(src, "      gates:\n")
	if start < 0 || end < start {
		t.Fatal("examples/rollout/policy.yaml lost its steps")
	}
	src = src[:start] + "      steps:\n" +
		fmt.Sprintf("      - {percent: 30, minDuration: %s, minRequests: 15}\n", step) +
		fmt.Sprintf("      - {percent: 60, minDuration: %s, minRequests: 15}\n", step) +
		fmt.Sprintf("      - {percent: 100, minDuration: %s, minRequests: 15}\n", step) + src[end:]
	// The gates keep their defaults (docs/rollouts.md); only the minimum sample is smaller, for a test of
	// seconds, and there is no warm-up (every conversation has a prompt of its own: no cache to warm).
	r := strings.NewReplacer("minRequests: 50 ", "minRequests: 20 ", "warmup: 30s", "warmup: 0s")
	return r.Replace(src)
}

func rolloutStack(t *testing.T, ctx context.Context, redis []string, step time.Duration) *Stack {
	t.Helper()
	return rolloutStackWith(t, ctx, redis, rolloutPolicy(t, step))
}

func rolloutStackWith(t *testing.T, ctx context.Context, redis []string, policy string) *Stack {
	t.Helper()
	dir := stackFiles(t, map[string]string{"policy.yaml": policy, "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml",
		"fleet.yaml": "repo:examples/rollout/fleet.yaml"})
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml",
		FreePorts: true, RedisAddrs: redis, RolloutInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// chatLoad sends conversations of three streamed turns from several workers until stopped; every request's
// end is counted, so that none goes missing.
type chatLoad struct {
	sent, ok atomic.Int64
	mu       sync.Mutex
	failures []string
	stop     context.CancelFunc
	done     sync.WaitGroup
}

func startLoad(urls []string, workers int) *chatLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &chatLoad{stop: cancel}
	var convs atomic.Int64
	for w := range workers {
		l.done.Add(1)
		go func() {
			defer l.done.Done()
			url := urls[w%len(urls)]
			for ctx.Err() == nil {
				conv := convs.Add(1)
				for turn := range 3 {
					if ctx.Err() != nil {
						return
					}
					l.one(url, conv, turn)
				}
			}
		}()
	}
	return l
}

// one sends a turn and reads its stream to [DONE].
func (l *chatLoad) one(url string, conv int64, turn int) {
	l.sent.Add(1)
	body := fmt.Sprintf(`{"model":"chat-8b","stream":true,"max_tokens":8,"messages":[{"role":"system","content":"Conversation %d of the rollout test, with its own instructions."},{"role":"user","content":"turn %d"}]}`, conv, turn)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-demo-acme")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-conversation-id", fmt.Sprint("conv-", conv))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.fail(err.Error())
		return
	}
	defer resp.Body.Close()
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		done = done || sc.Text() == "data: [DONE]"
	}
	if resp.StatusCode != http.StatusOK || !done {
		l.fail(fmt.Sprintf("status %d, stream complete %v", resp.StatusCode, done))
		return
	}
	l.ok.Add(1)
}

func (l *chatLoad) fail(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, why)
}

// end stops the load and checks that every request ended in a complete response.
func (l *chatLoad) end(t *testing.T) {
	t.Helper()
	l.stop()
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) > 0 || l.ok.Load() != l.sent.Load() {
		t.Errorf("%d of %d requests failed: %v", l.sent.Load()-l.ok.Load(), l.sent.Load(), l.failures[:min(5, len(l.failures))])
	}
}

// status is a replica's view of the chat-8b rollout at its last tick (the zero Status before its first).
func status(t *testing.T, c *rollout.Controller) rollout.Status {
	t.Helper()
	for _, s := range c.Statuses() {
		if s.Model == "chat-8b" {
			return s
		}
	}
	return rollout.Status{}
}

// servedBy sends one request as tenant key (with the rollout header arm, when set) and names the replica
// that answered.
func servedBy(t *testing.T, url, key, arm string, conv int) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":"chat-8b","max_tokens":2,"messages":[{"role":"user","content":"probe %d"}]}`, conv)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("x-conversation-id", fmt.Sprint("probe-", conv))
	if arm != "" {
		req.Header.Set("x-infergate-rollout", arm)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("probe: status %d", resp.StatusCode)
	}
	return resp.Header.Get("x-simulated-replica")
}

func transitions(t *testing.T, st *Stack, phase string) float64 {
	t.Helper()
	fams := scrape(t, st.MetricsURL)
	return sumCounter(fams, "infergate_rollout_transitions_total", func(l map[string]string) bool {
		return l["model"] == "chat-8b" && l["phase"] == phase
	})
}

// A healthy candidate passes the compatibility gate and every step, and is promoted; testers choose their arm.
func TestRolloutHealthyCandidateIsPromoted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := rolloutStack(t, ctx, nil, time.Second)
	load := startLoad([]string{st.URL}, 6)
	var worst rollout.Figures
	wait.Within(t, "the candidate promoted", rolloutLimit, func() bool {
		s := status(t, st.Gateway.Rollouts)
		if s.Phase == rollout.RolledBack {
			t.Fatalf("the healthy candidate was rolled back: %s", s.Reason)
		}
		if g := s.Gates; g != nil && g.Result != "insufficient" {
			worst.TTFTRatio, worst.TPOTRatio = max(worst.TTFTRatio, g.TTFTRatio), max(worst.TPOTRatio, g.TPOTRatio)
		}
		return s.Phase == rollout.Promoted
	})
	t.Logf("worst median ratios on the way: TTFT ×%.2f, TPOT ×%.2f", worst.TTFTRatio, worst.TPOTRatio)
	load.end(t)
	// Entering the first step and moving to the second and third are the three progressing transitions.
	if p, done := transitions(t, st, "progressing"), transitions(t, st, "promoted"); p != 3 || done != 1 {
		t.Errorf("transitions: %v progressing, %v promoted; want 3 and 1", p, done)
	}
	for _, name := range []string{"chat-v2-0", "chat-v2-1"} {
		if r, _ := st.Fleet.Replica(name); r.Received() == 0 {
			t.Errorf("candidate replica %s took no requests", name)
		}
	}
	for i := range 10 {
		if by := servedBy(t, st.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v2-") {
			t.Fatalf("after promotion served by %s", by)
		}
		if by := servedBy(t, st.URL, "sk-demo-acme", "baseline", i); !strings.HasPrefix(by, "chat-v2-") {
			t.Fatalf("a tenant that is no tester chose the baseline: %s", by)
		}
		if by := servedBy(t, st.URL, "sk-demo-globex", "baseline", i); !strings.HasPrefix(by, "chat-v1-") {
			t.Fatalf("the tester's baseline request was served by %s", by)
		}
	}
}

// A candidate that turns three times slower (docs/rollouts.md's example) is rolled back by the default gates: no
// request is lost, and the baseline's requests never wait on the slow engines.
func TestRolloutSlowCandidateRollsBack(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := rolloutStack(t, ctx, nil, time.Hour)
	settled := collect(ctx, st)
	load := startLoad([]string{st.URL}, 6)
	ctl := st.Gateway.Rollouts
	wait.Within(t, "the first step's candidate traffic", rolloutLimit, func() bool {
		s := status(t, ctl)
		return s.Phase == rollout.Progressing && s.Gates != nil && s.Gates.CandidateRequests >= 20
	})
	faultAt := time.Now()
	for _, name := range []string{"chat-v2-0", "chat-v2-1"} {
		r, _ := st.Fleet.Replica(name)
		if err := r.SetFaults(fleetsim.Faults{Slowdown: 3}); err != nil {
			t.Fatal(err)
		}
	}
	wait.Within(t, "the rollback", rolloutLimit, func() bool { return status(t, ctl).Phase == rollout.RolledBack })
	s := status(t, ctl)
	if ctl.Share("chat-8b") != 0 || !strings.Contains(s.Reason, "×") || strings.Contains(s.Reason, "error rate") {
		t.Fatalf("rolled back with share %v: %q", ctl.Share("chat-8b"), s.Reason)
	}
	// Routed after the rollback: the baseline only.
	for i := range 10 {
		if by := servedBy(t, st.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v1-") {
			t.Fatalf("after the rollback served by %s", by)
		}
	}
	load.end(t)
	all := settled()
	var slow int
	var baseBefore, baseAfter []time.Duration
	for _, x := range all {
		switch {
		case x.Arm == picker.ArmCandidate && !x.Started.Before(faultAt):
			slow++
		case x.Arm == picker.ArmBaseline && x.Timing.TTFT > 0 && x.Started.Before(faultAt):
			baseBefore = append(baseBefore, x.Timing.TTFT)
		case x.Arm == picker.ArmBaseline && x.Timing.TTFT > 0:
			baseAfter = append(baseAfter, x.Timing.TTFT)
		}
	}
	t.Logf("rolled back: %s; %d slowed candidate requests; gates %+v", s.Reason, slow, s.Gates)
	// The verdict is a latency or goodput gate's test over the step's requests, healthy ones from before the
	// fault among them; how many slowed requests it took depends on how busy the machine is, so it is logged.
	// The gates test load-adjusted shifts, so the step's raw medians may still be close when one fires; its
	// tail is the slowed requests'.
	if g := s.Gates; g == nil || g.Result != "fail" || g.CandidateRequests < 20 ||
		max(g.Evidence["ttft"], g.Evidence["tpot"], g.Evidence["goodput"]) < 1 ||
		max(g.TTFTRatio, g.TPOTRatio, g.TTFTP95Ratio, g.TPOTP95Ratio) <= 1.2 {
		t.Errorf("rolled back on %+v, want a latency or goodput gate failed, the candidate over 1.2× the baseline", s.Gates)
	}
	if pb, pa := p95(baseBefore), p95(baseAfter); len(baseAfter) < 20 || pa > 2*pb+20*time.Millisecond {
		t.Errorf("the baseline's TTFT p95 went from %v to %v (%d requests after the fault)", pb, pa, len(baseAfter))
	}
}

// Two gateway replicas share the rollout in Redis: they agree on the step, a restarted replica resumes it,
// and an abort sent to one returns every replica's traffic to the baseline.
func TestRolloutReplicasShareTheState(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	redis := redistest.Start(t)
	st := rolloutStack(t, ctx, []string{redis.Addr}, time.Second)
	bctx, stopB := context.WithCancel(ctx)
	b, err := st.AddReplica(bctx)
	if err != nil {
		t.Fatal(err)
	}
	a := st.Gateway.Rollouts
	load := startLoad([]string{st.URL, b.URL}, 6)
	wait.Within(t, "the second step", rolloutLimit, func() bool { s := status(t, a); return s.Phase == rollout.Progressing && s.Step >= 1 })
	load.end(t) // without traffic the gates hold: the step stays where it is
	step := status(t, a).Step
	wait.For(t, "replica b on replica a's step", func() bool { s := status(t, b.Gateway.Rollouts); return s.Step == step && s.Shared })
	if a.Share("chat-8b") != b.Gateway.Rollouts.Share("chat-8b") {
		t.Fatalf("shares %v and %v", a.Share("chat-8b"), b.Gateway.Rollouts.Share("chat-8b"))
	}

	stopB()
	c, err := st.AddReplica(ctx) // replica b, restarted
	if err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the restarted replica's first reading", func() bool { return status(t, c.Gateway.Rollouts).Phase != "" })
	if s := status(t, c.Gateway.Rollouts); s.Phase != rollout.Progressing || s.Step != step {
		t.Fatalf("the restarted replica is at %s step %d, not step %d", s.Phase, s.Step+1, step+1)
	}

	admin := httptest.NewServer(a.Handler())
	t.Cleanup(admin.Close)
	req, _ := http.NewRequest(http.MethodPost, admin.URL+rollout.AdminPath+"/abort?model=chat-8b", nil)
	req.Header.Set(rollout.AdminHeader, "e2e")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("abort: %d", resp.StatusCode)
	}
	// At once on the replica that took the command; on the other within its next read of the state.
	for i := range 10 {
		if by := servedBy(t, st.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v1-") {
			t.Fatalf("after the abort served by %s", by)
		}
	}
	wait.For(t, "the restarted replica aborted", func() bool { return c.Gateway.Rollouts.Share("chat-8b") == 0 })
	for i := range 10 {
		if by := servedBy(t, c.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v1-") {
			t.Fatalf("after the abort the other replica sent to %s", by)
		}
	}
}

// collect drains the stack's settlements until ctx ends; the returned function lists those seen so far.
func collect(ctx context.Context, st *Stack) func() []director.Settlement {
	var mu sync.Mutex
	var all []director.Settlement
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-st.Settled:
				mu.Lock()
				all = append(all, s)
				mu.Unlock()
			}
		}
	}()
	return func() []director.Settlement {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(all)
	}
}

func p95(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)*95+99)/100-1]
}

// rolloutSeries says whether a series name or a query reads a rollout's series, which a policy without a
// rollout does not have.
func rolloutSeries(nameOrExpr string) bool { return strings.Contains(nameOrExpr, "infergate_rollout_") }

// The rollout series the shipped dashboard and rules read are exported by a gateway running a rollout, and a
// real Prometheus loading the rules answers every rollout panel.
func TestRolloutSeriesAnswerTheDashboard(t *testing.T) {
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// An eval gate of one case, so that its pass rates are exported too.
	eval := "      eval:\n        cases:\n        - {name: words, prompt: \"Once upon a time\", maxTokens: 4, regex: '\\w'}\n"
	st := rolloutStackWith(t, ctx, nil, strings.Replace(rolloutPolicy(t, time.Hour), "      testers: [qa]", eval+"      testers: [qa]", 1))
	load := startLoad([]string{st.URL}, 4)
	defer load.end(t)
	want := queriedSeries(t, rolloutSeries)
	if len(want) < 5 {
		t.Fatalf("the dashboard and rules read %d rollout series: %v", len(want), want)
	}
	wait.For(t, "every rollout series the dashboard and rules read", func() bool {
		live := liveSeries(t, st.MetricsURL)
		for _, name := range want {
			if !live[name] {
				return false
			}
		}
		return true
	})
	queries, err := observability.DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, st.MetricsURL, filepath.Join(root, "deploy/observability/rules.yaml"))
	var asked int
	wait.For(t, "Prometheus to answer every rollout panel", func() bool {
		asked = 0
		for _, q := range queries {
			if !rolloutSeries(q.Expr) {
				continue
			}
			asked++
			if len(prom.query(t, grafanaVars.Replace(q.Expr), "")) == 0 {
				return false
			}
		}
		return true
	})
	if asked < 3 {
		t.Errorf("%d rollout queries on the dashboard", asked)
	}
}

// A shadow phase sends copies of the baseline's requests to the candidate, never a client's request: every
// client answer comes from the baseline, the candidate's engines answer copies, the copies are not counted
// as any tenant's requests, and once they pass the gates the first step starts.
func TestRolloutShadowPhase(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	policy := strings.Replace(rolloutPolicy(t, time.Hour), "      testers: [qa]",
		"      shadow: {percent: 50, minDuration: 2s, minRequests: 20, maxConcurrent: 4, maxPerSecond: 50}\n      testers: [qa]", 1)
	if !strings.Contains(policy, "shadow:") {
		t.Fatal("examples/rollout/policy.yaml lost its testers line")
	}
	st := rolloutStackWith(t, ctx, nil, policy)
	ctl := st.Gateway.Rollouts
	wait.Within(t, "the shadow phase", rolloutLimit, func() bool { return status(t, ctl).Phase == rollout.Shadowing })
	load := startLoad([]string{st.URL}, 4)
	for i := range 10 {
		if by := servedBy(t, st.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v1-") {
			t.Fatalf("a client's request in the shadow phase was served by %s", by)
		}
	}
	wait.Within(t, "the shadow phase to pass", rolloutLimit, func() bool {
		s := status(t, ctl)
		if s.Phase == rollout.RolledBack {
			t.Fatalf("the healthy candidate was rolled back in its shadow phase: %s", s.Reason)
		}
		return s.Phase == rollout.Progressing
	})
	load.end(t)
	var copied int64
	for _, name := range []string{"chat-v2-0", "chat-v2-1"} {
		r, _ := st.Fleet.Replica(name)
		copied += r.Received()
	}
	fams := scrape(t, st.MetricsURL)
	shadowOK := sumCounter(fams, "infergate_shadow_requests_total", func(l map[string]string) bool { return l["result"] == "ok" })
	tenants := sumCounter(fams, "infergate_tenant_requests_total", func(map[string]string) bool { return true })
	if copied < 20 || shadowOK < 20 {
		t.Errorf("the candidate's engines answered %d copies, the gateway settled %v", copied, shadowOK)
	}
	// Tenants' requests: the load's and the ten probes, never the copies.
	if sent := float64(load.sent.Load() + 10); tenants > sent {
		t.Errorf("tenants' requests counted %v, more than the %v sent: copies were charged", tenants, sent)
	}
	t.Logf("%d copies answered by the candidate; tenants' requests %v", copied, tenants)
}
