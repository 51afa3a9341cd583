package policies

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// GPUSpec is what capacity planning needs of one accelerator: memory, bandwidth, compute, and how close the
// engines get to them (the efficiencies fitted against published benchmarks).
type GPUSpec struct {
	// MemoryGiB is the device memory the driver reports (an 80 GB H100 shows about 79.2 GiB).
	MemoryGiB float64
	// MemoryBandwidthTBps is the peak HBM/GDDR bandwidth, TB/s.
	MemoryBandwidthTBps float64
	// BF16TFLOPS and FP8TFLOPS are dense peaks; FP8 0: no FP8 tensor cores (FP8 weights then compute in BF16).
	BF16TFLOPS, FP8TFLOPS float64
	// DecodeEfficiency is the share of the bandwidth decode reaches (η_m), PrefillEfficiency the share of the
	// FLOPS prefill reaches (η_p).
	DecodeEfficiency, PrefillEfficiency float64
	// AllReduce is one all-reduce between the replica's GPUs (two per layer per step under tensor parallelism).
	AllReduce time.Duration
}

// GPUPresets are the accelerators a hardware class can name with gpu: datasheet peaks and efficiencies
// fitted to published vLLM and TensorRT-LLM results.
var GPUPresets = map[string]GPUSpec{
	"a100":   {MemoryGiB: 79.2, MemoryBandwidthTBps: 2.04, BF16TFLOPS: 312, DecodeEfficiency: 0.8, PrefillEfficiency: 0.65, AllReduce: 15 * time.Microsecond},
	"h100":   {MemoryGiB: 79.2, MemoryBandwidthTBps: 3.35, BF16TFLOPS: 989, FP8TFLOPS: 1979, DecodeEfficiency: 0.8, PrefillEfficiency: 0.45, AllReduce: 15 * time.Microsecond},
	"h200":   {MemoryGiB: 139.8, MemoryBandwidthTBps: 4.8, BF16TFLOPS: 989, FP8TFLOPS: 1979, DecodeEfficiency: 0.8, PrefillEfficiency: 0.45, AllReduce: 15 * time.Microsecond},
	"l40s":   {MemoryGiB: 44.5, MemoryBandwidthTBps: 0.864, BF16TFLOPS: 362, FP8TFLOPS: 733, DecodeEfficiency: 0.8, PrefillEfficiency: 0.5, AllReduce: 40 * time.Microsecond},
	"mi300x": {MemoryGiB: 191.7, MemoryBandwidthTBps: 5.3, BF16TFLOPS: 1307, FP8TFLOPS: 2615, DecodeEfficiency: 0.7, PrefillEfficiency: 0.2, AllReduce: 25 * time.Microsecond},
}

// GPUNames lists the presets, sorted, for messages.
func GPUNames() []string { return slices.Sorted(maps.Keys(GPUPresets)) }

// GPU resolves a hardware class's accelerator: its preset with the class's overrides; ok is false when the
// class names no GPU and states no memory (it cannot be planned).
func (hc HardwareClass) GPU() (GPUSpec, bool) {
	g, ok := GPUPresets[hc.GPUModel]
	if hc.GPUMemoryGiB > 0 {
		g.MemoryGiB, ok = hc.GPUMemoryGiB, ok || hc.MemoryBandwidthTBps > 0 && hc.BF16TFLOPS > 0
	}
	if hc.MemoryBandwidthTBps > 0 {
		g.MemoryBandwidthTBps = hc.MemoryBandwidthTBps
	}
	if hc.BF16TFLOPS > 0 {
		g.BF16TFLOPS = hc.BF16TFLOPS
	}
	if hc.FP8TFLOPS > 0 {
		g.FP8TFLOPS = hc.FP8TFLOPS
	}
	if g.DecodeEfficiency == 0 {
		g.DecodeEfficiency, g.PrefillEfficiency, g.AllReduce = 0.8, 0.45, 40*time.Microsecond
	}
	return g, ok && g.MemoryGiB > 0
}

// Replica is how many GPUs one replica of the class spans (its tensor-parallel degree, default 1).
func (hc HardwareClass) Replica() int { return max(1, hc.GPUsPerReplica) }

// gpu validates a hardware class's accelerator fields.
func (v *validator) gpu(base []seg, hc HardwareClass) {
	if _, ok := GPUPresets[hc.GPUModel]; hc.GPUModel != "" && !ok {
		v.fail(append(slices.Clone(base), "gpu"), "unknown GPU %q (one of %s, or state gpuMemoryGiB, memoryBandwidthTBps and bf16TFLOPS)",
			hc.GPUModel, strings.Join(GPUNames(), ", "))
	}
	if hc.GPUsPerReplica < 0 || hc.GPUsPerReplica > 64 {
		v.fail(append(slices.Clone(base), "gpusPerReplica"), "must be between 1 and 64, got %d", hc.GPUsPerReplica)
	}
	for _, f := range []struct {
		name string
		x    float64
	}{{"gpuMemoryGiB", hc.GPUMemoryGiB}, {"memoryBandwidthTBps", hc.MemoryBandwidthTBps}, {"bf16TFLOPS", hc.BF16TFLOPS}, {"fp8TFLOPS", hc.FP8TFLOPS}} {
		if f.x < 0 {
			v.fail(append(slices.Clone(base), f.name), "must not be negative, got %v", f.x)
		}
	}
	if hc.GPUModel == "" && hc.GPUMemoryGiB > 0 && (hc.MemoryBandwidthTBps == 0 || hc.BF16TFLOPS == 0) {
		v.fail(append(slices.Clone(base), "gpuMemoryGiB"), "a GPU without a preset also needs memoryBandwidthTBps and bf16TFLOPS")
	}
}
