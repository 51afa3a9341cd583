package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infergate/infergate/test/e2e"
)

// demoPolicy writes the quickstart policy with its managed API pointed at the simulated one.
func demoPolicy(root, dir string) (string, error) {
	src, err := os.ReadFile(filepath.Join(root, "examples/quickstart/policy.yaml"))
	if err != nil {
		return "", err
	}
	policy, err := e2e.SimulatedProviderPolicy(src, dir)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "policy.yaml")
	return path, os.WriteFile(path, policy, 0o644)
}

// scenario is what DEMO_SCENARIO runs over the steady traffic: step is called every second, status is shown
// under the live table, summary at the end.
type scenario interface {
	step(st *e2e.Stack, elapsed time.Duration)
	status() string
	summary(samples []sample) string
}

func scenarioFor(name string) (scenario, error) {
	switch name {
	case "", "steady":
		return steady{}, nil
	case "pool-down":
		return &poolDown{downAt: 6 * time.Second, upAt: 16 * time.Second, prefix: "llama70b-"}, nil
	}
	return nil, fmt.Errorf("unknown DEMO_SCENARIO %q (steady, pool-down)", name)
}

type steady struct{}

func (steady) step(*e2e.Stack, time.Duration) {}
func (steady) status() string                 { return "" }
func (steady) summary([]sample) string        { return "" }

// poolDown takes the whole llama pool down — every replica refuses connections — then brings it back: its
// traffic overflows to the managed API and returns to the pool.
type poolDown struct {
	downAt, upAt time.Duration
	prefix       string
	down, up     bool
	err          error
}

func (p *poolDown) step(st *e2e.Stack, elapsed time.Duration) {
	switch {
	case !p.down && elapsed >= p.downAt:
		p.down = true
		_, p.err = e2e.PoolDown(st.Fleet, p.prefix, true)
	case p.down && !p.up && elapsed >= p.upAt:
		p.up = true
		_, p.err = e2e.PoolDown(st.Fleet, p.prefix, false)
	}
}

func (p *poolDown) status() string {
	state := fmt.Sprintf("llama pool goes down at %s", p.downAt)
	switch {
	case p.err != nil:
		state = "fault injection failed: " + p.err.Error()
	case p.up:
		state = "llama pool recovered: traffic is back on it"
	case p.down:
		state = fmt.Sprintf("llama pool DOWN (every replica refuses) until %s: llama traffic overflows to the managed API", p.upAt)
	}
	return "\nscenario pool-down: " + state + "\n"
}

// summary counts the llama requests each phase served, and where.
func (p *poolDown) summary(samples []sample) string {
	var managedDuring, poolDuring, poolAfter, failedDuring int
	for _, x := range samples {
		if !strings.HasPrefix(x.model, "llama") || x.tenant == "initech" {
			continue
		}
		switch during := x.at >= p.downAt && x.at < p.upAt; {
		case during && x.replica == "together":
			managedDuring++
		case during && strings.HasPrefix(x.replica, p.prefix):
			poolDuring++
		case during:
			failedDuring++
		case x.at >= p.upAt+3*time.Second && strings.HasPrefix(x.replica, p.prefix):
			poolAfter++
		}
	}
	return fmt.Sprintf("\nscenario pool-down: while the llama pool was down (%s to %s), %d llama requests were served by the managed API "+
		"(\"together\", with its own model name and key), %d finished on the pool before it went, %d failed; after it recovered, "+
		"%d were served by the pool again.\n", p.downAt, p.upAt, managedDuring, poolDuring, failedDuring, poolAfter)
}
