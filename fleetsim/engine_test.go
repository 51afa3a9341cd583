package fleetsim

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The simulated engine is the yardstick every routing benchmark is measured with, so its arithmetic is pinned
// against figures computed by hand: a step costs a fixed overhead, the prompt tokens it prefills at the
// hardware's prefill speed (cached tokens are free; chunked prefill shares the step's token budget with the
// decoding sequences), and a decode step that grows with the batch. A benchmark family then cannot reward a
// model of the engine that only this simulator has.
var honestHardware = Hardware{PrefillTokensPerSecond: 10000, DecodeStep: 20 * time.Millisecond,
	DecodeStepPerSeq: time.Millisecond, StepOverhead: 2 * time.Millisecond}

func honestEngine(budget, blocks int) *engine {
	return newEngine(EngineConfig{Hardware: honestHardware, BlockSize: 16, NumGPUBlocks: blocks, MaxNumBatchedTokens: budget})
}

// promptOf is n distinct tokens named after tag, so prompts of different tags share no block.
func promptOf(tag string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return out
}

func submitted(t *testing.T, e *engine, tokens []string, maxOut int) *seq {
	t.Helper()
	s, err := e.submit(context.Background(), tokens, maxOut)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stepIs plans one step, checks its simulated duration (to the microsecond: the engine converts float seconds),
// and applies it.
func stepIs(t *testing.T, e *engine, want time.Duration) {
	t.Helper()
	d, busy := e.step()
	if !busy || (d-want).Abs() > time.Microsecond {
		t.Fatalf("step took %v (busy %v), want %v", d, busy, want)
	}
	e.finishStep(nil)
}

// ms is a duration of fractional milliseconds.
func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

func TestEngineStepArithmetic(t *testing.T) {
	t.Run("a cold prompt: overhead + tokens ÷ prefill speed", func(t *testing.T) {
		e := honestEngine(2048, 1000)
		s := submitted(t, e, promptOf("a", 1000), 1)
		stepIs(t, e, ms(2+100)) // 1,000 tokens at 10,000/s
		if s.firstToken.IsZero() || s.cached != 0 {
			t.Errorf("first token %v, cached %d: want the first token after one step, nothing cached", s.firstToken, s.cached)
		}
	})
	t.Run("a cached prompt prefills only what the cache lacks", func(t *testing.T) {
		e := honestEngine(2048, 1000)
		submitted(t, e, promptOf("a", 1000), 1)
		stepIs(t, e, ms(102))
		again := submitted(t, e, promptOf("a", 1000), 1)
		// 62 full blocks (992 tokens) are cached; the other 8 are computed.
		stepIs(t, e, ms(2+0.8))
		if again.cached != 992 {
			t.Errorf("cached %d tokens, want 992", again.cached)
		}
	})
	t.Run("a fully cached prompt still computes its last token", func(t *testing.T) {
		e := honestEngine(2048, 1000)
		submitted(t, e, promptOf("a", 160), 1)
		stepIs(t, e, ms(2+16))
		again := submitted(t, e, promptOf("a", 160), 1)
		stepIs(t, e, ms(2+0.1))
		if again.cached != 159 {
			t.Errorf("cached %d tokens, want 159 (one is always computed)", again.cached)
		}
	})
	t.Run("chunked prefill: the step's token budget", func(t *testing.T) {
		e := honestEngine(512, 1000)
		s := submitted(t, e, promptOf("a", 1000), 1)
		stepIs(t, e, ms(2+51.2)) // 512 tokens
		if !s.firstToken.IsZero() {
			t.Fatal("first token before the prompt was prefilled")
		}
		stepIs(t, e, ms(2+48.8)) // the other 488
		if s.firstToken.IsZero() {
			t.Error("no first token once the prompt was prefilled")
		}
	})
	t.Run("prefill shares the step with the decoding sequences", func(t *testing.T) {
		e := honestEngine(301, 1000)
		submitted(t, e, promptOf("a", 100), 10)
		stepIs(t, e, ms(2+10))
		submitted(t, e, promptOf("b", 400), 10)
		// One decoding sequence takes one token of the budget: 300 of b's 400 prompt tokens fit.
		stepIs(t, e, ms(2+30+20+1))
		stepIs(t, e, ms(2+10+20+1))
	})
	for _, k := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("a decode step grows with the batch: %d sequences", k), func(t *testing.T) {
			e := honestEngine(2048, 1000)
			for i := range k {
				submitted(t, e, promptOf(fmt.Sprintf("s%d-", i), 10), 5)
			}
			stepIs(t, e, ms(2+float64(10*k)/10)) // every prompt prefilled in one step
			stepIs(t, e, ms(2+20+float64(k)))
		})
	}
}

// The engine's cache evicts least recently used blocks first: of two finished prompts, a third that needs room
// evicts the older one's blocks and leaves the newer one's cached.
func TestEngineEvictsLeastRecentlyUsedBlocks(t *testing.T) {
	// 20 blocks: each 160-token prompt holds 10 prompt blocks and 1 private block for its output while it runs.
	e := honestEngine(2048, 21)
	run := func(tag string) *seq {
		t.Helper()
		s := submitted(t, e, promptOf(tag, 160), 1)
		if d, busy := e.step(); !busy || d <= 0 {
			t.Fatalf("%s: no step", tag)
		}
		e.finishStep(nil)
		return s
	}
	run("old")
	run("new")
	run("third") // needs 11 of the 21 blocks, 20 of which hold the two finished prompts: evicts the old one's 10
	if s := run("new"); s.cached == 0 {
		t.Errorf("the most recent prompt was evicted (cached %d), want it kept", s.cached)
	}
	if s := run("old"); s.cached != 0 {
		t.Errorf("the oldest prompt kept %d cached tokens, want it evicted first", s.cached)
	}
}
