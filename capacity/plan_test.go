package capacity

import (
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/policies"
)

// sizingFor is a pool's arithmetic for a model at 2,048-token contexts, as the reference tables assume.
func sizingFor(preset, gpu string, gpus int, weights, kv Dtype) (*sizing, PoolPlan) {
	w := &Workload{GPUMemoryUtilization: 0.9, Headroom: 0.2, WarmPoolMinimum: 2, StepOverhead: time.Millisecond}
	load := ModelLoad{Weights: weights, KVCache: kv, RequestsPerSecond: 1,
		InputTokens: Lengths{Mean: 2048, P95: 2048}, OutputTokens: Lengths{Mean: 1, P95: 1}}
	s := &sizing{a: Presets[preset], load: load, w: w, gpu: policies.GPUPresets[gpu], gpus: gpus, costPerHour: 1,
		maxModelLen: Presets[preset].MaxContext}
	var pp PoolPlan
	if err := s.run(&pp, 0); err != nil {
		panic(err)
	}
	s.meanContext = 2048
	return s, pp
}

// KV tokens per replica at gpu_memory_utilization 0.9 (llm-serving-facts §1.3), and the configurations that do
// not fit at all.
func TestKVTokensPerReplica(t *testing.T) {
	for _, tc := range []struct {
		preset      string
		gpu         string
		gpus        int
		weights, kv Dtype
		tokens      float64 // 0: does not fit
	}{
		{"llama-3.1-8b", "h100", 1, BF16, BF16, 441e3},
		{"llama-3.1-8b", "h200", 1, BF16, BF16, 887e3},
		{"llama-3.1-8b", "l40s", 1, BF16, BF16, 185e3},
		{"llama-3.1-8b", "h100", 1, FP8, FP8, 988e3},
		{"llama-3.3-70b", "h200", 1, FP8, BF16, 182e3},
		{"llama-3.3-70b", "h200", 1, FP8, FP8, 364e3},
		{"llama-3.3-70b", "h100", 2, FP8, BF16, 222e3},
		{"llama-3.3-70b", "l40s", 4, FP8, FP8, 514e3},
		{"llama-3.3-70b", "mi300x", 1, FP8, BF16, 335e3},
		{"qwen2.5-32b", "h100", 1, BF16, BF16, 32e3},
		{"qwen2.5-32b", "h100", 1, FP8, FP8, 301e3},
		{"mixtral-8x7b", "h200", 1, BF16, BF16, 298e3},
		{"deepseek-v3", "h200", 8, FP8, BF16, 638e3},
		{"llama-3.3-70b", "h100", 1, FP8, BF16, 0}, // ~1 GiB left for KV: a few thousand tokens
		{"deepseek-v3", "h100", 8, FP8, BF16, 0},   // the weights alone overflow
		{"llama-3.3-70b", "l40s", 1, FP8, FP8, 0},
	} {
		_, pp := sizingFor(tc.preset, tc.gpu, tc.gpus, tc.weights, tc.kv)
		name := tc.preset + " on " + tc.gpu
		if tc.tokens == 0 {
			if pp.Fits {
				t.Errorf("%s ×%d: offered with %d KV tokens", name, tc.gpus, pp.KVTokensPerReplica)
			}
			continue
		}
		if !pp.Fits {
			t.Errorf("%s ×%d: %s", name, tc.gpus, pp.Why)
			continue
		}
		within(t, name+" KV tokens", float64(pp.KVTokensPerReplica), tc.tokens, 0.06)
	}
	// The 70B model on one H100: said, not offered.
	if _, pp := sizingFor("llama-3.3-70b", "h100", 1, FP8, BF16); !strings.Contains(pp.Why, "fewer than the 131072-token context") {
		t.Errorf("why: %q", pp.Why)
	}
}

// Decode steps at 2,048-token contexts (llm-serving-facts §2.2's model estimates, 1 ms step overhead).
func TestDecodeStep(t *testing.T) {
	for _, tc := range []struct {
		preset, gpu string
		gpus        int
		weights     Dtype
		b1, b64     time.Duration
	}{
		{"llama-3.1-8b", "h100", 1, BF16, 7100 * time.Microsecond, 13400 * time.Microsecond},
		{"llama-3.1-8b", "h200", 1, BF16, 5300 * time.Microsecond, 9700 * time.Microsecond},
		{"llama-3.1-8b", "l40s", 1, BF16, 24600 * time.Microsecond, 49100 * time.Microsecond},
		{"llama-3.3-70b", "h200", 1, FP8, 20100 * time.Microsecond, 31100 * time.Microsecond},
		{"llama-3.3-70b", "h100", 2, FP8, 17100 * time.Microsecond, 25000 * time.Microsecond},
	} {
		s, _ := sizingFor(tc.preset, tc.gpu, tc.gpus, tc.weights, BF16)
		name := tc.preset + " on " + tc.gpu
		within(t, name+" TPOT at batch 1 (ms)", s.step(1).Seconds()*1e3, tc.b1.Seconds()*1e3, 0.05)
		within(t, name+" TPOT at batch 64 (ms)", s.step(64).Seconds()*1e3, tc.b64.Seconds()*1e3, 0.05)
	}
	// A MoE reads the experts its batch touches: Mixtral reads about 12.9 B parameters at batch 1 and nearly
	// all 46.7 B at batch 64.
	s, _ := sizingFor("mixtral-8x7b", "h200", 1, BF16, BF16)
	within(t, "Mixtral bytes read at batch 1 (GB)", s.a.readBytes(s.weights, 1)/1e9, 25.8, 0.03)
	within(t, "Mixtral bytes read at batch 64 (GB)", s.a.readBytes(s.weights, 64)/1e9, 93.4, 0.01)
}

// Prefill against a published point: 5,000 tokens of Llama-3.3-70B FP8 on two H100s take about 0.41 s.
func TestPrefill(t *testing.T) {
	s, _ := sizingFor("llama-3.3-70b", "h100", 2, FP8, BF16)
	within(t, "TTFT of 5,000 tokens (s)", s.prefill(5000, 0).Seconds(), 0.407, 0.05)
	// Half cached: half the linear work, but the new tokens still attend to the cached ones.
	if full, half := s.prefill(5000, 0), s.prefill(5000, 0.5); half >= full || half <= full/2 {
		t.Errorf("a half-cached prompt prefills in %v against %v uncached", half, full)
	}
}
