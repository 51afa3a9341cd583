package main

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
)

// epoch is the simulated clock's zero.
var epoch = time.Unix(1_700_000_000, 0)

// loop is a discrete-event loop in simulated time: arrivals, engine steps and the controller's ticks are
// events, so nothing depends on the machine's clock or load.
type loop struct {
	now    time.Duration
	events events
	seq    uint64
}

type event struct {
	at  time.Duration
	seq uint64
	f   func()
}

type events []*event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (l *loop) after(d time.Duration, f func()) {
	l.seq++
	heap.Push(&l.events, &event{at: l.now + max(0, d), seq: l.seq, f: f})
}

// run executes events in time order until stop says so or none is left.
func (l *loop) run(stop func() bool) {
	for len(l.events) > 0 && !stop() {
		e := heap.Pop(&l.events).(*event)
		l.now = e.at
		e.f()
	}
}

// Now is the simulated time, the controller's clock.
func (l *loop) Now() time.Time { return epoch.Add(l.now) }

// engine is one simulated replica of an arm.
type engine struct {
	v        *fleetsim.VirtualEngine
	arm      string
	inflight int
	stepping bool
	// slow is the replica's step-time factor at a time: 1, or the noisy neighbour's.
	slow func(time.Duration) float64
	// stepScale multiplies every step (a slower candidate engine).
	stepScale float64
	pending   map[*fleetsim.Sequence]*request
}

// request is one request's life, from arrival to its settlement.
type request struct {
	arm     string
	load    int // requests in flight at its engine when it arrived, as the picker counts them
	arrived time.Duration
	first   time.Duration
	eng     *engine
}

// fleet is the two arms' engines, the load and the faults of one run, feeding settlements to the observer.
type fleet struct {
	l        *loop
	rng      *rand.Rand
	arms     map[string][]*engine // candidate, baseline: each the whole fleet's size, the first active ones used
	active   map[string]int
	fault    fault
	settle   func(director.Settlement)
	ttftSLO  time.Duration
	tpotSLO  time.Duration
	jitter   float64 // σ of each step's log-normal jitter
	prompt   []string
	sent     [2]int // candidate, baseline requests sent
	stopping bool
}

// engineConfig is an H100-class replica of an 8B model: small enough that a run of a few simulated minutes
// takes well under a second.
func engineConfig(h fleetsim.Hardware) fleetsim.EngineConfig {
	return fleetsim.EngineConfig{Hardware: h, BlockSize: 16, NumGPUBlocks: 8192, MaxNumSeqs: 64, MaxNumBatchedTokens: 4096}
}

// baseHardware is the baseline engines' speed.
var baseHardware = fleetsim.Hardware{PrefillTokensPerSecond: 30000, DecodeStep: 8 * time.Millisecond,
	DecodeStepPerSeq: 150 * time.Microsecond, StepOverhead: time.Millisecond}

// setShare sizes the arms for the candidate's share: the candidate's replicas follow its share of traffic
// (at least one), as a canary whose replicas scale with its weight does; or, fixed, that many replicas each.
func (f *fleet) setShare(share float64, replicas, fixed int) {
	c := min(replicas, max(1, int(math.Round(share*float64(replicas)))))
	b := replicas - c
	switch {
	case share <= 0:
		c, b = 0, replicas
	case fixed > 0:
		c, b = fixed, fixed
	}
	f.active[picker.ArmCandidate], f.active[picker.ArmBaseline] = c, b
}

// arrive sends one request to an arm: the least busy of its active engines.
func (f *fleet) arrive(arm string, promptTokens, maxOut int) {
	if f.stopping {
		return
	}
	i := 0
	if arm == picker.ArmBaseline {
		i = 1
	}
	f.sent[i]++
	r := &request{arm: arm, arrived: f.l.now}
	if arm == picker.ArmCandidate && f.fault.errorRate > 0 && f.rng.Float64() < f.fault.errorRate {
		// The candidate's engine answers 500 after a short while.
		f.l.after(20*time.Millisecond, func() { f.emit(r, director.OutcomeUpstream5xx, 0, 0) })
		return
	}
	var best *engine
	for _, e := range f.arms[arm][:f.active[arm]] {
		if best == nil || e.inflight < best.inflight {
			best = e
		}
	}
	if best == nil {
		return
	}
	seq, err := best.v.Submit(f.l.Now(), f.prompt[:promptTokens], maxOut)
	if err != nil {
		return
	}
	r.load = best.inflight
	best.inflight++
	r.eng = best
	best.pending[seq] = r
	f.kick(best)
}

// kick plans an idle engine's next step, its length jittered and scaled by the replica's slowness.
func (f *fleet) kick(e *engine) {
	if e.stepping {
		return
	}
	d, ok := e.v.Step(f.l.Now())
	if !ok {
		return
	}
	e.stepping = true
	scale := e.stepScale * e.slow(f.l.now) * math.Exp(f.jitter*f.rng.NormFloat64())
	f.l.after(time.Duration(float64(d)*scale), func() { f.finish(e) })
}

// finish applies an engine's step and settles the requests it finished.
func (f *fleet) finish(e *engine) {
	e.stepping = false
	first, done := e.v.Finish(f.l.Now())
	for _, s := range first {
		if r := e.pending[s]; r != nil {
			r.first = f.l.now
		}
	}
	for _, s := range done {
		r := e.pending[s]
		if r == nil {
			continue
		}
		delete(e.pending, s)
		e.inflight--
		ttft := r.first - r.arrived
		var tpot time.Duration
		if s.Output() > 1 {
			tpot = (f.l.now - r.first) / time.Duration(s.Output()-1)
		}
		f.emitTokens(r, director.OutcomeOK, ttft, tpot, s.Output())
	}
	f.kick(e)
}

// emit settles a request as the gateway would observe it.
func (f *fleet) emit(r *request, outcome string, ttft, tpot time.Duration) {
	f.emitTokens(r, outcome, ttft, tpot, 0)
}

// emitTokens settles a request that generated output tokens.
func (f *fleet) emitTokens(r *request, outcome string, ttft, tpot time.Duration, output int) {
	if r.arm == picker.ArmCandidate && f.fault.ttft > 0 {
		ttft = time.Duration(float64(ttft) * f.fault.ttft)
	}
	if r.arm == picker.ArmCandidate && f.fault.tpot > 0 {
		tpot = time.Duration(float64(tpot) * f.fault.tpot)
	}
	good := outcome == director.OutcomeOK && ttft <= f.ttftSLO && tpot <= f.tpotSLO
	finish := ""
	if outcome == director.OutcomeOK {
		cut := baseUnfinished
		if r.arm == picker.ArmCandidate {
			cut += f.fault.unfinished
		}
		finish = openai.FinishStop
		if f.rng.Float64() < cut {
			finish = openai.FinishLength
		}
	}
	f.settle(director.Settlement{Routed: true, Model: model, Arm: r.arm, Good: good, Outcome: outcome, HardwareClass: "h100", Load: int64(r.load),
		Started: epoch.Add(r.arrived), Timing: director.Timing{TTFT: ttft, TPOT: tpot, Chunked: ttft > 0},
		Usage: openai.Usage{CompletionTokens: int64(output)}, FinishReason: finish})
}
