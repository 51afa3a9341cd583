package fleetsim

import (
	"context"
	"time"
)

// VirtualEngine is one replica's engine — the same continuous batching, chunked prefill, decode-step growth
// and LRU prefix cache the HTTP replicas run — stepped by its caller in simulated time instead of by timers:
// a discrete-event benchmark runs hundreds of fleets in the time one real-time run takes, and no CPU
// contention on the machine bends its figures. The caller owns the clock: Submit at an arrival, Step when the
// engine is idle or its last step has ended, Finish when the step's time has passed. Not safe for concurrent
// use with itself (one event loop drives it).
type VirtualEngine struct {
	e   *engine
	now time.Time
}

// Sequence is one request inside a VirtualEngine.
type Sequence struct{ s *seq }

// NewVirtualEngine sizes an engine as EngineConfig does (TimeScale is ignored: time is the caller's).
func NewVirtualEngine(cfg EngineConfig) *VirtualEngine {
	cfg.TimeScale = 1
	v := &VirtualEngine{}
	v.e = newEngine(cfg)
	v.e.now = func() time.Time { return v.now }
	return v
}

// Submit queues a prompt of whitespace tokens (the simulator's tokenizer) that generates up to maxOut tokens,
// arriving at at. A request longer than the engine's whole KV cache is refused, as the HTTP replica answers
// 400.
func (v *VirtualEngine) Submit(at time.Time, tokens []string, maxOut int) (*Sequence, error) {
	v.now = at
	s, err := v.e.submit(context.Background(), tokens, maxOut)
	if err != nil {
		return nil, err
	}
	s.handle = &Sequence{s}
	return s.handle, nil
}

// Step admits waiting requests at at and plans the next engine step: its simulated length, or false when
// nothing runs (the engine idles until the next Submit).
func (v *VirtualEngine) Step(at time.Time) (time.Duration, bool) {
	v.now = at
	return v.e.step()
}

// Finish applies the planned step at at, its end, and returns the sequences whose first token came in it
// (their prefill ended: what a gateway sees as the first chunk with content) and those that finished in it,
// each in the engine's order (the handles Submit returned). A sequence may be in both.
func (v *VirtualEngine) Finish(at time.Time) (firstTokens, finished []*Sequence) {
	v.now = at
	for _, s := range v.e.running {
		if n, ok := v.e.current.prefill[s]; ok && n == s.prefillLeft {
			firstTokens = append(firstTokens, s.handle)
		}
	}
	var retired []*seq
	v.e.finishStep(&retired)
	finished = make([]*Sequence, len(retired))
	for i, s := range retired {
		finished[i] = s.handle
	}
	return firstTokens, finished
}

// Load is what the engine's /metrics would report now: running and waiting requests and the KV cache's
// usage (0..1).
func (v *VirtualEngine) Load() (running, waiting int, kvUsage float64) {
	snap := v.e.snapshot()
	return snap.running, snap.waiting, snap.kvUsage
}

// PromptCounters are what the engine's /metrics would report of its prompt tokens, as vllm:prompt_tokens_total
// and vllm:prefix_cache_hits_total do: those admitted to prefill, and those of them its prefix cache held. Both
// count at admission; vLLM counts the first at the request's first token.
func (v *VirtualEngine) PromptCounters() (prompt, cached int64) { return v.e.promptCounters() }

// BusyTime is the simulated time the engine has spent in steps.
func (v *VirtualEngine) BusyTime() time.Duration { return v.e.busyTime() }

// Prompt is the request's prompt tokens.
func (q *Sequence) Prompt() int { return q.s.prompt }

// Cached is how many prompt tokens the engine served from its prefix cache.
func (q *Sequence) Cached() int { return q.s.cached }

// Output is how many tokens it has generated.
func (q *Sequence) Output() int { return q.s.out }

// FirstToken is when prefill ended and its first token came (zero before).
func (q *Sequence) FirstToken() time.Time { return q.s.firstToken }

// Finished is when it retired (zero before).
func (q *Sequence) Finished() time.Time { return q.s.finished }

// ImportKV adds a prompt's KV blocks to the engine's prefix cache, as a decode replica does once it has pulled
// them from its prefiller (disagg.go): its next Submit of that prompt prefills only the last token.
func (v *VirtualEngine) ImportKV(tokens []string) { v.e.importKV(tokens) }
