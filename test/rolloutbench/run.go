package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/rollout"
)

const model = "chat-8b"

// fault is what is wrong with the candidate (nothing, in an A/A run).
type fault struct {
	name string
	// slowdown multiplies every engine step (TTFT and TPOT both grow); ttft and tpot multiply only the
	// candidate's time to its first token or only its time per later token, as a slower scheduler or a slower
	// decode kernel would (a TTFT-only or a TPOT-only regression); errorRate is the share of requests answered
	// 500.
	slowdown, ttft, tpot float64
	errorRate            float64
	// unfinished adds to the candidate's share of answers cut at max tokens (every run's answers are cut at
	// baseUnfinished on both arms).
	unfinished float64
	// fixedPools gives each arm that many replicas whatever the share, instead of the candidate's replicas
	// following its share: at every step but 50 % the arms carry unequal loads per engine, and at 100 % the
	// candidate's pool takes the whole load and is judged against the baseline's sample at half of it. The
	// gates compare the arms at the same load (docs/rollouts.md).
	fixedPools int
}

// faults are the rows of the report: A/A first.
var faults = []fault{
	{name: "A/A (none)"},
	{name: "slowdown 1.5×", slowdown: 1.5},
	{name: "slowdown 2×", slowdown: 2},
	{name: "slowdown 3×", slowdown: 3},
	{name: "errors 2 %", errorRate: 0.02},
	{name: "errors 5 %", errorRate: 0.05},
	{name: "errors 20 %", errorRate: 0.2},
	{name: "TTFT only ×1.5", ttft: 1.5},
	{name: "TPOT only ×1.5", tpot: 1.5},
	{name: "cut at max tokens +10 points", unfinished: 0.10},
	{name: "A/A, fixed pools of 2 + 2", fixedPools: 2},
	{name: "slowdown 1.5×, fixed pools of 2 + 2", slowdown: 1.5, fixedPools: 2},
}

// baseUnfinished is the share of both arms' answers that end at max tokens (finish reason length).
const baseUnfinished = 0.08

// replicas is the fleet's size; the candidate takes max(1, share × replicas) of them.
const replicas = 10

// policyYAML is the rollout under test: four steps of two simulated minutes, the gates at their defaults.
const policyYAML = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2.5, prefillTokensPerSecond: 30000, decodeTokensPerSecond: 3000}
  models:
  - name: chat-8b
    pools:
    - {name: v1, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.1:8000"]}
    - {name: v2, hardwareClass: h100, engine: vllm, endpoints: ["10.0.0.2:8000"]}
    rollout:
      candidate: {pool: v2}
      steps:
      - {percent: 10, minDuration: 2m, minRequests: 200}
      - {percent: 30, minDuration: 2m, minRequests: 200}
      - {percent: 50, minDuration: 2m, minRequests: 200}
      - {percent: 100, minDuration: 2m, minRequests: 200}
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// outcome is one rollout's end.
type outcome struct {
	rolledBack bool
	reason     string
	// candidateRequests are the candidate's requests until the rollback (or the promotion); at is when.
	candidateRequests int
	at                time.Duration
	step              int
}

// noise is one run's draw of the noise every run has: load swings, step jitter and a noisy neighbour.
type noise struct {
	rate             float64       // mean requests per second
	swing            float64       // the load's relative amplitude
	period           time.Duration // of the load swing
	phase            float64
	jitter           float64 // σ of each engine step's log-normal jitter
	neighbourArm     string  // the arm whose replica has a noisy neighbour
	neighbourReplica int
	neighbourSlow    float64 // its step-time factor while the neighbour is busy
	neighbourOn      time.Duration
	neighbourPeriod  time.Duration
}

func drawNoise(rng *rand.Rand) noise {
	arm := picker.ArmBaseline
	if rng.IntN(2) == 0 {
		arm = picker.ArmCandidate
	}
	return noise{rate: 55 + 20*rng.Float64(), swing: 0.2 + 0.3*rng.Float64(), period: time.Duration(60+rng.IntN(120)) * time.Second,
		phase: 2 * math.Pi * rng.Float64(), jitter: 0.05 + 0.1*rng.Float64(), neighbourArm: arm, neighbourReplica: rng.IntN(replicas),
		neighbourSlow: 1.2 + 0.3*rng.Float64(), neighbourOn: time.Duration(5+rng.IntN(15)) * time.Second,
		neighbourPeriod: time.Duration(40+rng.IntN(40)) * time.Second}
}

// runOne runs one seeded rollout of a candidate with the fault, to its rollback or promotion.
func runOne(dir string, f fault, seed uint64) (outcome, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	n := drawNoise(rng)
	path := filepath.Join(dir, fmt.Sprintf("policy-%d.yaml", seed))
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		return outcome{}, err
	}
	defer os.Remove(path)
	pols, err := policies.NewStore(path, nil)
	if err != nil {
		return outcome{}, err
	}
	l := &loop{}
	ctrl := rollout.New(rollout.Options{Policies: pols, Now: l.Now, Client: &http.Client{Transport: modelsList{}}})
	fl := &fleet{l: l, rng: rng, arms: map[string][]*engine{}, active: map[string]int{}, fault: f, settle: ctrl.Settled,
		ttftSLO: 300 * time.Millisecond, tpotSLO: 25 * time.Millisecond, jitter: n.jitter, prompt: strings.Fields(strings.Repeat("t ", 4096))}
	for _, arm := range []string{picker.ArmCandidate, picker.ArmBaseline} {
		for i := range replicas {
			scale := 1.0
			if arm == picker.ArmCandidate {
				scale = max(1, f.slowdown)
			}
			e := &engine{v: fleetsim.NewVirtualEngine(engineConfig(baseHardware)), arm: arm, stepScale: scale, slow: func(time.Duration) float64 { return 1 },
				pending: map[*fleetsim.Sequence]*request{}}
			if arm == n.neighbourArm && i == n.neighbourReplica {
				e.slow = func(t time.Duration) float64 {
					if t%n.neighbourPeriod < n.neighbourOn {
						return n.neighbourSlow
					}
					return 1
				}
			}
			fl.arms[arm] = append(fl.arms[arm], e)
		}
	}
	ctx := context.Background()
	var out outcome
	done := false
	var tick func()
	tick = func() {
		ctrl.Tick(ctx)
		st := ctrl.Statuses()[0]
		fl.setShare(st.Share, replicas, f.fixedPools)
		switch st.Phase {
		case rollout.RolledBack, rollout.Promoted:
			out = outcome{rolledBack: st.Phase == rollout.RolledBack, reason: st.Reason, candidateRequests: fl.sent[0], at: l.now, step: st.Step}
			done = true
			return
		}
		l.after(time.Second, tick)
	}
	tick()
	var arrive func()
	arrive = func() {
		share := ctrl.Share(model)
		arm := picker.ArmBaseline
		if rng.Float64() < share {
			arm = picker.ArmCandidate
		}
		fl.arrive(arm, promptLength(rng), outputLength(rng))
		// Thinning a Poisson process of the peak rate to the swinging one.
		peak := n.rate * (1 + n.swing)
		at := l.now
		for {
			at += time.Duration(rng.ExpFloat64() / peak * float64(time.Second))
			rate := n.rate * (1 + n.swing*math.Sin(2*math.Pi*float64(at)/float64(n.period)+n.phase))
			if rng.Float64()*peak <= rate {
				l.after(at-l.now, arrive)
				return
			}
		}
	}
	l.after(0, arrive)
	l.run(func() bool { return done || l.now > time.Hour })
	if !done {
		return outcome{}, fmt.Errorf("seed %d: no end within an hour of simulated time", seed)
	}
	return out, nil
}

// modelsList answers the compatibility gate's GET /v1/models as the candidate's engines would, without a
// network.
type modelsList struct{}

func (modelsList) RoundTrip(r *http.Request) (*http.Response, error) {
	body := `{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

// promptLength and outputLength draw a chat request's tokens: log-normal, medians 300 and 40.
func promptLength(rng *rand.Rand) int {
	return min(4000, max(16, int(300*math.Exp(0.6*rng.NormFloat64()))))
}

func outputLength(rng *rand.Rand) int {
	return min(400, max(4, int(40*math.Exp(0.5*rng.NormFloat64()))))
}
