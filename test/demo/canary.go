package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/test/e2e"
)

// canaryPool is the pool DEMO_SCENARIO=rollout releases: qwen's second replica, standing for a new engine
// build, as a pool of its own.
const (
	canaryPool    = "qwen7b-l40s-next"
	canaryReplica = "qwen7b-l40s-1"
)

// canaryPolicy splits the quickstart's qwen pool into the baseline (one replica) and a candidate (the other)
// with a rollout of three steps after a 10-second warm-up: 25 % for 10 s, then 50 % — where the two replicas
// carry the same load, so the gates compare like with like — for a minute, within which the fault comes.
// The gates keep their defaults (docs/rollouts.md) but for a smaller minimum sample.
func canaryPolicy(policy []byte) ([]byte, error) {
	const pool = `      endpoints: ["127.0.0.1:18121", "127.0.0.1:18122"]` + "\n"
	src := string(policy)
	if !strings.Contains(src, pool) {
		return nil, fmt.Errorf("the quickstart policy's qwen pool changed: update the rollout scenario")
	}
	return []byte(strings.Replace(src, pool, `      endpoints: ["127.0.0.1:18121"]
    - name: `+canaryPool+`
      hardwareClass: l40s
      engine: vllm
      servedModel: Qwen/Qwen2.5-7B-Instruct
      endpoints: ["127.0.0.1:18122"]
    rollout:
      candidate: {pool: `+canaryPool+`}
      steps:
      - {percent: 25, minDuration: 10s, minRequests: 20}
      - {percent: 50, minDuration: 60s, minRequests: 20}
      - {percent: 100, minDuration: 10s, minRequests: 20}
      gates: {minRequests: 30, warmup: 10s}
`, 1)), nil
}

// canary follows the rollout through the admin endpoint and, at faultAt, makes the candidate three times
// slower: the gates see it and roll it back, and qwen traffic returns to the baseline.
type canary struct {
	faultAt  time.Duration
	admin    string
	injected time.Duration // when the fault went in (0: not yet)
	rolledAt time.Duration // when this demo first read the rollback (0: not yet)
	err      error
	last     rollout.Status
	history  []string
}

func (c *canary) step(st *e2e.Stack, elapsed time.Duration) {
	s, err := c.read()
	if err != nil {
		c.err = err
		return
	}
	if s.Phase != c.last.Phase || s.Step != c.last.Step {
		c.history = append(c.history, fmt.Sprintf("%4.0fs %s", elapsed.Seconds(), describe(s)))
		if s.Phase == rollout.RolledBack && c.rolledAt == 0 {
			c.rolledAt = elapsed
		}
	}
	c.last, c.err = s, nil
	if c.injected == 0 && elapsed >= c.faultAt {
		if r, ok := st.Fleet.Replica(canaryReplica); ok {
			c.err = r.SetFaults(fleetsim.Faults{Slowdown: 3})
			c.injected = elapsed
			c.history = append(c.history, fmt.Sprintf("%4.0fs fault: %s (the candidate) three times slower", elapsed.Seconds(), canaryReplica))
		}
	}
}

func (c *canary) read() (rollout.Status, error) {
	resp, err := http.Get(c.admin + rollout.AdminPath + "?model=qwen2.5-7b")
	if err != nil {
		return rollout.Status{}, err
	}
	defer resp.Body.Close()
	var list []rollout.Status
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list) != 1 {
		return rollout.Status{}, fmt.Errorf("admin endpoint: %d, %v", resp.StatusCode, err)
	}
	return list[0], nil
}

func describe(s rollout.Status) string {
	out := string(s.Phase)
	if s.Phase == rollout.Progressing || s.Phase == rollout.Paused {
		out += fmt.Sprintf(" step %d/%d", s.Step+1, s.Steps)
	}
	return fmt.Sprintf("%s, candidate share %.0f%%: %s", out, 100*s.Share, s.Reason)
}

func (c *canary) status() string {
	state := fmt.Sprintf("qwen's %s released as a canary; it turns 3× slower at %s", canaryPool, c.faultAt)
	if c.err != nil {
		state = "rollout unavailable: " + c.err.Error()
	} else if c.last.Phase != "" {
		state = describe(c.last)
		if g := c.last.Gates; g != nil {
			state += fmt.Sprintf("\n  gates over the step so far: %s; candidate %d, baseline %d requests; TTFT ×%.2f (p95 ×%.2f), TPOT ×%.2f (p95 ×%.2f), goodput ×%.2f",
				g.Result, g.CandidateRequests, g.BaselineRequests, g.TTFTRatio, g.TTFTP95Ratio, g.TPOTRatio, g.TPOTP95Ratio, g.GoodputRatio)
		}
	}
	return "\nscenario rollout (infergate rollout status shows the same): " + state + "\n"
}

// summary tells the rollout's story and where qwen's requests went before the fault and after the rollback.
func (c *canary) summary(samples []sample) string {
	var b strings.Builder
	b.WriteString("\nscenario rollout:\n")
	for _, h := range c.history {
		b.WriteString("  " + h + "\n")
	}
	var before, after, total int
	for _, x := range samples {
		if !strings.HasPrefix(x.model, "qwen") || x.replica == "" {
			continue
		}
		total++
		switch {
		case x.replica == canaryReplica && (c.injected == 0 || x.at < c.injected):
			before++
		case x.replica == canaryReplica:
			after++
		}
	}
	fmt.Fprintf(&b, "  %d qwen requests; the candidate served %d before the fault and %d after it (until the rollback took effect).\n",
		total, before, after)
	switch {
	case c.rolledAt == 0:
		b.WriteString("  not rolled back within the demo's duration.\n")
	case c.injected == 0 || c.rolledAt < c.injected:
		b.WriteString("  rolled back BEFORE the fault: a healthy candidate rolled back (a false rollback).\n")
	default:
		fmt.Fprintf(&b, "  rolled back %.0f s after the fault.\n", (c.rolledAt - c.injected).Seconds())
	}
	return b.String()
}
