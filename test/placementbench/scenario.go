package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/infergate/infergate/fleetsim"
)

// The scenario family. Each scenario is drawn from its seed: one model of 7B-70B on 2-4 hardware classes,
// the classes' speeds and prices, the SLO, the workload's sharing, group sizes and load. Its kind makes sure
// the situations the issue names all occur across the family, not only where chance puts them:
//
//   - fastCheap: the class that prefills fastest is also the cheapest per output token;
//   - slowCheap: the class that prefills slowest is the cheapest per output token;
//   - cachedOnly: the cheapest class per output token misses the TTFT target for an uncached prompt of the
//     mean length, and meets it once the prompt's shared prefix is cached;
//   - smallKV: one class's KV cache cannot hold the model's longest context (prompt + output), so an engine
//     of that class refuses the longest requests and runs few at once.
const (
	fastCheap = iota
	slowCheap
	cachedOnly
	smallKV
	kinds
)

var kindNames = [kinds]string{"fast class cheaper", "slow class cheaper", "cheap class meets TTFT only cached", "one class cannot hold the context"}

// class is one hardware class of a scenario, with its speed for the scenario's model.
type class struct {
	name         string
	price        float64 // USD per replica-hour
	speed        fleetsim.Hardware
	maxNumSeqs   int
	numGPUBlocks int
	replicas     int
}

// scenario is one fleet and workload of the family.
type scenario struct {
	id      int
	kind    int
	seed    uint64
	model   string
	sizeB   int // parameters, billions
	classes []class
	ttft    time.Duration
	tpot    time.Duration
	// The workload: share of requests opening with a group's shared prefix, the mean group size (requests per
	// prefix group, 1-64), how many groups are active at once, the shared prefix's tokens per group.
	shared      float64
	groupMean   float64
	activeGroup int
	// load is the arrival rate ÷ the fleet's capacity: constant at loadLo, or ramped loadLo → loadHi → loadLo.
	loadLo, loadHi float64
	ramped         bool
	// lag is the starved gateway's mean own delay the family runs under (-lag), 0 for a gateway with CPU to spare.
	lag time.Duration
	// misstate is how wrong the policy's speeds are (-misstate; see statedSpeed), 1 or 0 for right.
	misstate float64
	// gateways is how many gateway replicas share the fleet (-gateways), each deciding every n-th request; 0
	// or 1 for one. Unless apart is set, they share their placements, as they do with Redis; silent keeps the
	// long prompts each sends to itself (a build before picker.Placement.Prefill).
	gateways      int
	apart, silent bool
	// pd, set for the P/D bench (-pd), gives the scenario's policy per row and the long prompts' TTFT target.
	pd *pdScenario
}

// ttftFor is a request's TTFT target: the scenario's, or the P/D bench's for a long prompt.
func (s *scenario) ttftFor(r *request) time.Duration {
	if r.long && s.pd != nil {
		return s.pd.longTTFT
	}
	return s.ttft
}

// Prompts are 500-2,000 tokens, outputs 50-500, as the family asks.
const (
	minPrompt, maxPrompt = 500, 2000
	minOutput, maxOutput = 50, 500
	meanPrompt           = (minPrompt + maxPrompt) / 2.0
	meanOutput           = (minOutput + maxOutput) / 2.0
	blockSize            = 16
	longest              = maxPrompt + maxOutput + 16 // tokens: the longest request, with the chat template's
)

// archetypes are the catalogue a scenario's classes are drawn from: a 70B model's speeds at FP8 (fleetsim's
// profiles) and a price per replica-hour; each draw jitters them.
var archetypes = []struct {
	name  string
	price float64
	hw    fleetsim.Hardware
}{
	{"h200", 3.50, fleetsim.Profiles["h200"]},
	{"h100", 2.60, fleetsim.Profiles["h100"]},
	{"mi300x", 2.50, fleetsim.Profiles["mi300x"]},
	{"l40s", 1.10, fleetsim.Profiles["l40s"]},
	{"a100", 1.60, fleetsim.Hardware{PrefillTokensPerSecond: 11000, DecodeStep: 26 * time.Millisecond, DecodeStepPerSeq: 250 * time.Microsecond, StepOverhead: time.Millisecond}},
}

// generate draws scenario id of the family from seed.
func generate(id int, seed uint64) scenario {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	sizes := []int{7, 8, 13, 14, 32, 34, 70, 72}
	s := scenario{id: id, kind: id % kinds, seed: seed, sizeB: sizes[rng.IntN(len(sizes))]}
	s.model = fmt.Sprintf("model-%db", s.sizeB)
	n := 2 + rng.IntN(3)
	names := rng.Perm(len(archetypes))[:n]
	for i, a := range names {
		s.classes = append(s.classes, drawClass(rng, a, i, s.sizeB))
	}
	s.shared = 0.9 * rng.Float64()
	s.groupMean = math.Exp(rng.Float64() * math.Log(64)) // 1-64, log-uniform
	s.activeGroup = 4 + rng.IntN(29)
	s.ramped = (id/kinds)%2 == 1
	s.loadLo = 0.3 + 1.2*rng.Float64()
	if s.ramped {
		s.loadLo = 0.3 + 0.4*rng.Float64()
		s.loadHi = 1.0 + 0.5*rng.Float64()
	}
	s.shape(rng)
	return s
}

// drawClass jitters an archetype's speed and price and scales them to a model of sizeB billion parameters:
// prefill is compute-bound (faster in proportion to the size, up to 8×), a decode step memory-bound (its
// weights read once per step) with a fixed floor.
func drawClass(rng *rand.Rand, archetype, i, sizeB int) class {
	a := archetypes[archetype]
	jitter := func(spread float64) float64 { return 1 + spread*(2*rng.Float64()-1) }
	scale := 70 / float64(sizeB)
	hw := a.hw
	hw.PrefillTokensPerSecond *= min(8, scale) * jitter(0.3)
	hw.DecodeStep = time.Duration(float64(hw.DecodeStep) * math.Max(0.3, math.Pow(1/scale, 0.7)) * jitter(0.25))
	hw.DecodeStepPerSeq = time.Duration(float64(hw.DecodeStepPerSeq) / min(8, scale) * jitter(0.25))
	c := class{name: fmt.Sprintf("%s-%d", a.name, i), price: a.price * jitter(0.25), speed: hw,
		maxNumSeqs: []int{16, 24, 32}[rng.IntN(3)], numGPUBlocks: 3000 + rng.IntN(5001), replicas: 1 + rng.IntN(3)}
	return c
}

// shape makes the scenario's kind occur and sets its SLO.
func (s *scenario) shape(rng *rand.Rand) {
	fast := slices.IndexFunc(s.classes, func(c class) bool { return c.speed.PrefillTokensPerSecond == s.maxPrefill() })
	slow := slices.IndexFunc(s.classes, func(c class) bool { return c.speed.PrefillTokensPerSecond == s.minPrefill() })
	switch s.kind {
	case fastCheap:
		s.makeCheapest(fast, 0.6+0.3*rng.Float64())
	case slowCheap:
		s.makeCheapest(slow, 0.5+0.4*rng.Float64())
	case smallKV:
		c := &s.classes[rng.IntN(len(s.classes))]
		c.numGPUBlocks = (1200 + rng.IntN(1201)) / blockSize // 1,200-2,400 tokens: below the longest request
	}
	// TTFT: the slowest class's TTFT for a mean prompt prefilled beside a full batch's decode step, times 2-5;
	// TPOT: the slowest full-batch step, times 1.2-2.
	idle := func(c class, tokens float64) time.Duration {
		return fullStep(c) + time.Duration(tokens/c.speed.PrefillTokensPerSecond*float64(time.Second))
	}
	s.ttft = time.Duration(float64(idle(s.classes[slow], meanPrompt)) * (2 + 3*rng.Float64()))
	var step time.Duration
	for _, c := range s.classes {
		step = max(step, fullStep(c))
	}
	s.tpot = time.Duration(float64(step) * (1.2 + 0.8*rng.Float64()))
	if s.kind == cachedOnly {
		s.shared = 0.4 + 0.5*rng.Float64()
		// The cheapest class per token (made the slowest) misses the target for an uncached mean prompt by
		// 30 %, the fastest meets the longest uncached prompt with room.
		cheap := s.cheapest()
		if cheap == fast {
			s.makeCheapest(slow, 0.6)
			cheap = slow
		}
		s.ttft = max(s.ttft, 3*idle(s.classes[fast], maxPrompt))
		c := &s.classes[cheap]
		c.speed.PrefillTokensPerSecond = meanPrompt / (1.3 * s.ttft.Seconds())
	}
	s.ttft = (s.ttft + 5*time.Millisecond).Round(10 * time.Millisecond)
	s.tpot = (s.tpot + time.Millisecond).Round(time.Millisecond)
}

// makeCheapest prices class i at factor × the cheapest other class's price per output token.
func (s *scenario) makeCheapest(i int, factor float64) {
	best := math.Inf(1)
	for j, c := range s.classes {
		if j != i {
			best = min(best, c.perToken())
		}
	}
	s.classes[i].price = best * factor * decodeTPS(s.classes[i]) * 3600 / 1e6
}

func (s *scenario) cheapest() int {
	i := 0
	for j, c := range s.classes {
		if c.perToken() < s.classes[i].perToken() {
			i = j
		}
	}
	return i
}

func (s *scenario) maxPrefill() float64 {
	m := 0.0
	for _, c := range s.classes {
		m = max(m, c.speed.PrefillTokensPerSecond)
	}
	return m
}

func (s *scenario) minPrefill() float64 {
	m := math.Inf(1)
	for _, c := range s.classes {
		m = min(m, c.speed.PrefillTokensPerSecond)
	}
	return m
}

// batch is how many mean requests a replica of the class runs at once: its batch size, or fewer when its KV
// cache holds fewer.
func (c class) batch() int {
	return max(1, min(c.maxNumSeqs, c.numGPUBlocks*blockSize/int(meanPrompt+meanOutput)))
}

// fullStep is a decode step at the class's batch.
func fullStep(c class) time.Duration {
	return c.speed.StepOverhead + c.speed.DecodeStep + time.Duration(c.batch())*c.speed.DecodeStepPerSeq
}

// decodeTPS is the class's decode throughput at its batch: the policy's decodeTokensPerSecond.
func decodeTPS(c class) float64 { return float64(c.batch()) / fullStep(c).Seconds() }

// perToken is USD per 1M output tokens at the class's batch.
func (c class) perToken() float64 { return c.price / 3600 / decodeTPS(c) * 1e6 }

// capacity is a replica's requests per second at its batch, every prompt uncached.
func (c class) capacity() float64 {
	return 1 / (meanOutput/decodeTPS(c) + meanPrompt/c.speed.PrefillTokensPerSecond)
}

// capacity is the fleet's requests per second.
func (s *scenario) capacity() float64 {
	total := 0.0
	for _, c := range s.classes {
		total += float64(c.replicas) * c.capacity()
	}
	return total
}

// holdsContext says whether a replica of c can take the longest request at all.
func (c class) holdsContext() bool { return c.numGPUBlocks*blockSize >= longest }

// cheapMeetsSLO says whether a class cheaper per token than the dearest can meet the SLO, at least for a
// request whose shared prefix is cached: the scenarios where cost placement has something to win.
func (s *scenario) cheapMeetsSLO() bool {
	dearest := 0.0
	for _, c := range s.classes {
		dearest = max(dearest, c.perToken())
	}
	for _, c := range s.classes {
		cached := meanPrompt * (1 - 0.6*min(1, s.shared/0.5))
		idle := c.speed.StepOverhead + time.Duration(cached/c.speed.PrefillTokensPerSecond*float64(time.Second))
		if c.perToken() < 0.95*dearest && idle <= s.ttft && fullStep(c) <= s.tpot && c.holdsContext() {
			return true
		}
	}
	return false
}

// describe is the scenario's line in the family table.
func (s *scenario) describe() string {
	var cls []string
	for _, c := range s.classes {
		cls = append(cls, fmt.Sprintf("%s×%d ($%.2f/h, %.0fk prefill tok/s, $%.3f/1M out, %d KV blocks)", c.name, c.replicas, c.price,
			c.speed.PrefillTokensPerSecond/1000, c.perToken(), c.numGPUBlocks))
	}
	load := fmt.Sprintf("%.2f× constant", s.loadLo)
	if s.ramped {
		load = fmt.Sprintf("%.2f× → %.2f× → %.2f×", s.loadLo, s.loadHi, s.loadLo)
	}
	return fmt.Sprintf("%d | %s | %s | %s | TTFT %s, TPOT %s | shared %.0f%%, groups of %.1f, %d active | %s | %.1f req/s",
		s.id, kindNames[s.kind], s.model, strings.Join(cls, "; "), s.ttft, s.tpot, 100*s.shared, s.groupMean, s.activeGroup, load, s.capacity())
}
