package fleetsim

import (
	"context"
	"sync"
	"time"
)

// Hardware is a GPU class's speed for one model, in simulated time.
type Hardware struct {
	PrefillTokensPerSecond float64       `yaml:"prefillTokensPerSecond"` // whole-replica prefill throughput, shared by concurrent prefills
	DecodeStep             time.Duration `yaml:"decodeStep"`             // time per output token with one sequence running
	DecodeStepPerSeq       time.Duration `yaml:"decodeStepPerSeq"`       // added to each decode step per running sequence
	StepOverhead           time.Duration `yaml:"stepOverhead"`           // fixed scheduler/CPU cost per engine step
}

// Profiles are ballparks for a 70B-class model at FP8; the simulator's point is
// that their ratios are right, not their absolute values.
var Profiles = map[string]Hardware{
	"h200":   {PrefillTokensPerSecond: 24000, DecodeStep: 20 * time.Millisecond, DecodeStepPerSeq: 150 * time.Microsecond, StepOverhead: time.Millisecond},
	"h100":   {PrefillTokensPerSecond: 18000, DecodeStep: 17 * time.Millisecond, DecodeStepPerSeq: 200 * time.Microsecond, StepOverhead: time.Millisecond},
	"l40s":   {PrefillTokensPerSecond: 7000, DecodeStep: 34 * time.Millisecond, DecodeStepPerSeq: 400 * time.Microsecond, StepOverhead: time.Millisecond},
	"mi300x": {PrefillTokensPerSecond: 20000, DecodeStep: 21 * time.Millisecond, DecodeStepPerSeq: 150 * time.Microsecond, StepOverhead: 1500 * time.Microsecond},
}

// EngineConfig sizes one simulated replica.
type EngineConfig struct {
	Hardware            Hardware
	BlockSize           int     // tokens per KV block (vLLM default 16)
	NumGPUBlocks        int     // KV capacity in blocks
	MaxNumSeqs          int     // running sequences at most (continuous batching)
	MaxNumBatchedTokens int     // tokens per engine step (chunked prefill budget)
	TimeScale           float64 // real seconds per simulated second (0.1 runs ten times faster)
}

// seq is one request inside the engine.
type seq struct {
	prompt      int // prompt tokens
	hashes      []uint64
	cached      int // prompt tokens served from cache
	prefillLeft int
	maxOut      int
	out         int
	private     int // KV blocks not shared through the prefix cache
	arrived     time.Time
	firstToken  time.Time
	finished    time.Time // when it retired
	handle      *Sequence // a VirtualEngine's handle on it
	tokens      chan int  // receives the running output count; closed when finished
	ctx         context.Context
	admitted    bool
}

// engine runs continuous batching for one replica: a waiting queue, running sequences holding KV blocks,
// chunked prefill sharing one token budget per step, and decode steps that slow down as the batch grows.
type engine struct {
	cfg EngineConfig
	now func() time.Time // the engine's clock: time.Now, or the simulated time of a VirtualEngine

	mu      sync.Mutex
	cache   *kvCache
	waiting []*seq
	running []*seq
	wake    chan struct{}
	slow    float64     // fault: multiply step times
	current pendingStep // the step in progress; touched only by the engine goroutine, under mu

	// counters for metrics (tokens and requests)
	promptTokens, genTokens, cacheQueries, cacheHits, finished int64
	ttfts                                                      []float64     // simulated seconds, drained by metrics
	busy                                                       time.Duration // simulated time spent in steps
}

func newEngine(cfg EngineConfig) *engine {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.MaxNumSeqs == 0 {
		cfg.MaxNumSeqs = 256
	}
	if cfg.MaxNumBatchedTokens == 0 {
		cfg.MaxNumBatchedTokens = 2048
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	return &engine{cfg: cfg, now: time.Now, cache: newKVCache(cfg.BlockSize, cfg.NumGPUBlocks), wake: make(chan struct{}, 1), slow: 1}
}

// submit queues a request. Its tokens channel yields the output-token count as tokens are produced (the
// first value marks the end of prefill) and is closed at the end; cached is set once it is admitted.
func (e *engine) submit(ctx context.Context, tokens []string, maxOut int) (*seq, error) {
	hashes := blockHashes(tokens, e.cfg.BlockSize)
	totalBlocks := (len(tokens) + maxOut + e.cfg.BlockSize - 1) / e.cfg.BlockSize
	s := &seq{
		prompt: len(tokens), hashes: hashes, maxOut: maxOut, arrived: e.now(),
		private: max(0, totalBlocks-len(hashes)), tokens: make(chan int, maxOut+2), ctx: ctx,
	}
	if totalBlocks > e.cfg.NumGPUBlocks {
		return nil, errTooLong
	}
	e.mu.Lock()
	e.waiting = append(e.waiting, s)
	e.mu.Unlock()
	e.poke()
	return s, nil
}

// importKV puts a prompt's blocks in the cache as computed, as a pull of a prefiller's KV cache does: the
// prompt's prefill on this engine is then a cache hit.
func (e *engine) importKV(tokens []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache.insert(blockHashes(tokens, e.cfg.BlockSize))
}

func (e *engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// run steps the engine until ctx ends.
func (e *engine) run(ctx context.Context) {
	for {
		d, busy := e.step()
		if !busy {
			select {
			case <-ctx.Done():
				return
			case <-e.wake:
			}
			continue
		}
		t := time.NewTimer(time.Duration(float64(d) * e.cfg.TimeScale))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		e.finishStep(nil)
	}
}

// pendingStep holds what the step in progress will produce when its time has passed.
type pendingStep struct {
	prefill map[*seq]int
	decode  []*seq
}

// step admits waiting requests, plans one engine step and returns its simulated duration.
func (e *engine) step() (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropCancelled()
	// Admit in arrival order while sequences and KV blocks allow (no overtaking: FCFS like vLLM).
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[0]
		hit, ok := e.cache.allocate(s.hashes, s.private)
		if !ok {
			break // the KV wall: wait for running sequences to free blocks
		}
		s.admitted = true
		s.cached = min(hit*e.cfg.BlockSize, s.prompt-1) // at least one token is always computed
		s.prefillLeft = s.prompt - s.cached
		e.cacheQueries += int64(s.prompt)
		e.cacheHits += int64(hit * e.cfg.BlockSize)
		e.promptTokens += int64(s.prompt)
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
	}
	if len(e.running) == 0 {
		return 0, false
	}
	budget := e.cfg.MaxNumBatchedTokens
	plan := pendingStep{prefill: map[*seq]int{}}
	for _, s := range e.running {
		if s.prefillLeft == 0 {
			plan.decode = append(plan.decode, s)
			budget--
		}
	}
	prefillTokens := 0
	for _, s := range e.running {
		if s.prefillLeft > 0 && budget > 0 {
			n := min(s.prefillLeft, budget)
			plan.prefill[s] = n
			budget -= n
			prefillTokens += n
		}
	}
	hw := e.cfg.Hardware
	d := hw.StepOverhead + time.Duration(float64(prefillTokens)/hw.PrefillTokensPerSecond*float64(time.Second))
	if len(plan.decode) > 0 {
		d += hw.DecodeStep + time.Duration(len(plan.decode))*hw.DecodeStepPerSeq
	}
	e.current = plan
	d = time.Duration(float64(d) * e.slow)
	e.busy += d
	return d, true
}

// finishStep applies the step's prefill and decode progress and retires finished sequences, which it returns
// to a caller that asks (retired non-nil).
func (e *engine) finishStep(retired *[]*seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	for s, n := range e.current.prefill {
		s.prefillLeft -= n
		if s.prefillLeft == 0 {
			e.cache.markComputed(s.hashes)
			s.firstToken = now
			s.out = min(1, s.maxOut)
			e.genTokens += int64(s.out)
			e.ttfts = append(e.ttfts, now.Sub(s.arrived).Seconds()/e.cfg.TimeScale)
			s.tokens <- s.out
		}
	}
	for _, s := range e.current.decode {
		s.out++
		s.tokens <- s.out
	}
	e.genTokens += int64(len(e.current.decode))
	kept := e.running[:0]
	for _, s := range e.running {
		if s.prefillLeft == 0 && s.out >= s.maxOut || s.ctx.Err() != nil {
			s.finished = now
			e.retire(s)
			if retired != nil {
				*retired = append(*retired, s)
			}
			continue
		}
		kept = append(kept, s)
	}
	e.running = kept
	e.current = pendingStep{}
}

func (e *engine) retire(s *seq) {
	e.cache.release(s.hashes, s.private)
	if s.ctx.Err() == nil {
		e.finished++
	}
	close(s.tokens)
}

// dropCancelled removes waiting requests whose client went away.
func (e *engine) dropCancelled() {
	kept := e.waiting[:0]
	for _, s := range e.waiting {
		if s.ctx.Err() != nil {
			close(s.tokens)
			continue
		}
		kept = append(kept, s)
	}
	e.waiting = kept
}

// snapshot is what /metrics reports.
type engineSnapshot struct {
	running, waiting                                           int
	kvUsage                                                    float64
	promptTokens, genTokens, cacheQueries, cacheHits, finished int64
	ttfts                                                      []float64
}

func (e *engine) snapshot() engineSnapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := engineSnapshot{
		running: len(e.running), waiting: len(e.waiting), kvUsage: e.cache.usage(),
		promptTokens: e.promptTokens, genTokens: e.genTokens, cacheQueries: e.cacheQueries, cacheHits: e.cacheHits,
		finished: e.finished, ttfts: e.ttfts,
	}
	e.ttfts = nil
	return s
}

// promptCounters are the engine's prompt-token counters: admitted to prefill, and held by the prefix cache. Apart
// from snapshot, which empties the TTFTs /metrics has not reported yet.
func (e *engine) promptCounters() (prompt, cached int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.promptTokens, e.cacheHits
}

// busyTime is the simulated time the engine has spent stepping: what a fleet that scales to its load pays
// GPU-hours for.
func (e *engine) busyTime() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.busy
}

func (e *engine) setSlowdown(f float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f <= 0 {
		f = 1
	}
	e.slow = f
}
