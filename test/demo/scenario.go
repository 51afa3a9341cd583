package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/test/e2e"
)

// demoPolicy writes the quickstart policy with its managed API pointed at the simulated one (and, for the
// rollout scenario, qwen's canary).
func demoPolicy(root, dir, scenario string) (string, error) {
	src, err := os.ReadFile(filepath.Join(root, "examples/quickstart/policy.yaml"))
	if err != nil {
		return "", err
	}
	policy, err := e2e.SimulatedProviderPolicy(src, dir)
	if err != nil {
		return "", err
	}
	switch scenario {
	case "rollout":
		if policy, err = canaryPolicy(policy); err != nil {
			return "", err
		}
	case "region-down":
		if policy, err = e2e.RegionalPolicy(policy); err != nil {
			return "", err
		}
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

// scenarios are the names DEMO_SCENARIO takes.
var scenarios = []string{"steady", "pool-down", "replica-fails", "quota", "long-prompts", "rollout", "region-down"}

func scenarioFor(name string) (scenario, error) {
	switch name {
	case "", "steady":
		return steady{}, nil
	case "pool-down":
		return &poolDown{downAt: 6 * time.Second, upAt: 16 * time.Second, prefix: "llama70b-"}, nil
	case "replica-fails":
		return &replicaFails{from: 6 * time.Second, to: 16 * time.Second, replica: "llama70b-h200-0"}, nil
	case "quota":
		return &burst{name: "quota", from: 5 * time.Second, to: 10 * time.Second, rate: 20, tenant: tenants[2],
			model: "qwen2.5-7b", system: groups[0]}, nil
	case "rollout":
		return &canary{faultAt: 45 * time.Second, admin: "http://" + adminAddr}, nil
	case "region-down":
		return &regionDown{poolDown: poolDown{downAt: 6 * time.Second, upAt: 16 * time.Second, prefix: "llama70b-h200"}}, nil
	case "long-prompts":
		return &burst{name: "long-prompts", from: 5 * time.Second, to: 10 * time.Second, rate: 6, tenant: tenants[0],
			model: "llama-3.3-70b", system: strings.Repeat(groups[1], 12)}, nil
	}
	return nil, fmt.Errorf("unknown DEMO_SCENARIO %q (%s)", name, strings.Join(scenarios, ", "))
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

// replicaFails makes one replica answer every request with a 500 for a while: Envoy retries on another replica
// and ejects it (outlier detection), infergate sees its errors, and clients see next to none.
type replicaFails struct {
	from, to  time.Duration
	replica   string
	failing   bool
	recovered bool
	err       error
}

func (r *replicaFails) step(st *e2e.Stack, elapsed time.Duration) {
	set := func(f fleetsim.Faults) {
		if rep, ok := st.Fleet.Replica(r.replica); ok {
			r.err = rep.SetFaults(f)
		}
	}
	switch {
	case !r.failing && elapsed >= r.from:
		r.failing = true
		set(fleetsim.Faults{ErrorRate: 1})
	case r.failing && !r.recovered && elapsed >= r.to:
		r.recovered = true
		set(fleetsim.Faults{})
	}
}

func (r *replicaFails) status() string {
	state := fmt.Sprintf("%s fails at %s", r.replica, r.from)
	switch {
	case r.err != nil:
		state = "fault injection failed: " + r.err.Error()
	case r.recovered:
		state = r.replica + " serves again"
	case r.failing:
		state = fmt.Sprintf("%s answers every request with 500 until %s: Envoy retries elsewhere and ejects it", r.replica, r.to)
	}
	return "\nscenario replica-fails: " + state + "\n"
}

func (r *replicaFails) summary(samples []sample) string {
	var ok, failed int
	for _, x := range samples {
		if x.at < r.from || x.at >= r.to || !strings.HasPrefix(x.model, "llama") || x.tenant == "initech" {
			continue
		}
		if x.status == 200 {
			ok++
		} else {
			failed++
		}
	}
	return fmt.Sprintf("\nscenario replica-fails: while %s failed (%s to %s), %d llama requests succeeded on the other replicas and %d failed.\n",
		r.replica, r.from, r.to, ok, failed)
}

// burst adds, for a while, a tenant's extra traffic at a fixed rate: "quota" sends initech past its 2 requests
// per second (429s with x-ratelimit-* headers, the others untouched), "long-prompts" sends acme's long prompts,
// which the prefill scorer steers to the hardware class that prefills fastest (H200).
type burst struct {
	name          string
	from, to      time.Duration
	rate          float64
	tenant        tenant
	model, system string
	started       bool
	mu            sync.Mutex
	results       []sample
	// record, when set, also counts each answer in the demo's tables (the tenant's 429s among them).
	record func(sample)
}

func (b *burst) step(st *e2e.Stack, elapsed time.Duration) {
	if b.started || elapsed < b.from {
		return
	}
	b.started = true
	go func() {
		client := &http.Client{Timeout: 60 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), b.to-b.from)
		defer cancel()
		tick := time.NewTicker(time.Duration(float64(time.Second) / b.rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			go func() {
				x := chat(context.Background(), client, st.URL, b.tenant, b.model, b.system, fmt.Sprintf("Burst question %d?", i))
				b.mu.Lock()
				b.results = append(b.results, x)
				b.mu.Unlock()
				if b.record != nil {
					b.record(x)
				}
			}()
		}
	}()
}

func (b *burst) status() string {
	b.mu.Lock()
	n := len(b.results)
	b.mu.Unlock()
	if !b.started {
		return fmt.Sprintf("\nscenario %s: a burst of %s's %s requests starts at %s\n", b.name, b.tenant.name, b.model, b.from)
	}
	return fmt.Sprintf("\nscenario %s: burst of %s's %s requests (%.0f/s, %s to %s), %d answered so far\n", b.name, b.tenant.name,
		b.model, b.rate, b.from, b.to, n)
}

func (b *burst) summary([]sample) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	byStatus, byClass := map[int]int{}, map[string]int{}
	for _, x := range b.results {
		byStatus[x.status]++
		if x.status == 200 {
			class := "l40s"
			if strings.Contains(x.replica, "h200") {
				class = "h200"
			}
			byClass[class]++
		}
	}
	if b.name == "quota" {
		return fmt.Sprintf("\nscenario quota: %s sent %d requests over its limit of 2 a second: %d admitted, %d refused with 429 "+
			"(with x-ratelimit-* and retry-after headers).\n", b.tenant.name, len(b.results),
			byStatus[200], byStatus[429])
	}
	return fmt.Sprintf("\nscenario long-prompts: %d long prompts (about %d KiB each): %d prefilled on H200, %d on L40S.\n",
		len(b.results), len(b.system)>>10, byClass["h200"], byClass["l40s"])
}

// regionDown runs the quickstart in two regions (e2e.RegionalPolicy) from us-east, and takes us-east's llama
// pool (the H200s) down, then back: llama traffic fails over to us-west's L40Ss, globex — pinned to us-east —
// is refused with a 503 naming its residency, and the traffic returns once us-east has stayed up for the
// policy's regionFailback (10 s).
type regionDown struct{ poolDown }

func (r *regionDown) status() string {
	state := fmt.Sprintf("us-east's llama pool (H200) goes down at %s", r.downAt)
	switch {
	case r.err != nil:
		state = "fault injection failed: " + r.err.Error()
	case r.up:
		state = "us-east's llama pool is back: traffic returns to it once it has stayed up for 10 s (regionFailback)"
	case r.down:
		state = fmt.Sprintf("us-east's llama pool DOWN until %s: llama traffic fails over to us-west (L40S); globex, pinned to us-east, gets 503 residency_unavailable", r.upAt)
	}
	return "\nscenario region-down: " + state + "\n"
}

// summary counts the llama requests of each phase by where they went, and when us-east took them back.
func (r *regionDown) summary(samples []sample) string {
	var west, refused, failed int
	statuses := map[string]int{} // the others' failures, by tenant and status
	back := time.Duration(-1)
	for _, x := range samples {
		if !strings.HasPrefix(x.model, "llama") || x.tenant == "initech" { // initech may not use llama (403)
			continue
		}
		during := x.at >= r.downAt+time.Second && x.at < r.upAt
		switch {
		case during && x.tenant == "globex" && x.status == http.StatusServiceUnavailable:
			refused++
		case during && strings.HasPrefix(x.replica, "llama70b-l40s"):
			west++
		case during && x.status != http.StatusOK:
			failed++
			statuses[fmt.Sprintf("%s %d", x.tenant, x.status)]++
		case x.at >= r.upAt && back < 0 && x.tenant != "globex" && strings.HasPrefix(x.replica, r.prefix):
			back = x.at - r.upAt // globex may only be served there: it goes back at once
		}
	}
	after := "not within the demo"
	if back >= 0 {
		after = back.Round(100*time.Millisecond).String() + " after it came back"
	}
	others := fmt.Sprintf("%d others failed", failed)
	if failed > 0 {
		others += fmt.Sprintf(" (by tenant and status: %v)", statuses)
	}
	return fmt.Sprintf("\nscenario region-down: while us-east's llama pool was down (%s to %s), %d llama requests were served in us-west, "+
		"%d of globex's (pinned to us-east) were refused with 503 residency_unavailable, %s; the other tenants' llama traffic came back to us-east %s.\n",
		r.downAt, r.upAt, west, refused, others, after)
}
