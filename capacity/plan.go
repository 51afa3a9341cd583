package capacity

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/infergate/infergate/policies"
)

const gib = 1 << 30

// nonKVOverheadGiB is what an engine keeps per GPU besides weights and KV cache (activations at the token
// budget, CUDA graphs, NCCL buffers): about 2.5 GiB alone, 3.5 GiB under tensor parallelism.
func nonKVOverheadGiB(gpus int) float64 {
	if gpus > 1 {
		return 3.5
	}
	return 2.5
}

// PoolPlan is one pool's answer: what a replica holds and does, and how many the load needs.
type PoolPlan struct {
	Model, Pool, HardwareClass, GPU string
	GPUsPerReplica                  int
	// Fits is false when a replica cannot serve the model at all (weights or one request's KV do not fit, or
	// even an idle replica misses the SLO); Why says which, and the sizing fields are then zero.
	Fits bool   `json:"fits"`
	Why  string `json:"why,omitempty"`

	KVBytesPerToken    float64 `json:"kvBytesPerToken"` // whole model
	WeightsGiBPerGPU   float64 `json:"weightsGiBPerGPU"`
	KVPoolGiBPerGPU    float64 `json:"kvPoolGiBPerGPU"`
	KVTokensPerReplica int     `json:"kvTokensPerReplica"`
	// MaxSequences is how many sequences of the mean context the KV cache holds at once; Batch the batch the
	// plan runs at, bounded by the KV cache, the TPOT target or the engine's max_num_seqs (BatchLimit).
	MaxSequences int    `json:"maxSequences"`
	Batch        int    `json:"batch"`
	BatchLimit   string `json:"batchLimit"`
	// TPOT at Batch, the replica's decode tokens per second there, a mean request's prefill time, and the TTFT
	// p95 at the planned load.
	TPOT                  time.Duration `json:"tpotNanos"`
	DecodeTokensPerSecond float64       `json:"decodeTokensPerSecond"`
	Prefill               time.Duration `json:"prefillNanos"`
	TTFTP95               time.Duration `json:"ttftP95Nanos"`
	// RequestsPerSecondPerReplica is what one replica sustains within the SLO, before headroom.
	RequestsPerSecondPerReplica float64 `json:"requestsPerSecondPerReplica"`
	Replicas                    int     `json:"replicas"`
	CostPerHour                 float64 `json:"costPerHourUSD"`
	CostPerMOutputTokens        float64 `json:"costPerMOutputTokensUSD"`
	// ByHitRate is the replicas needed at other prefix-cache hit rates, the workload's among them.
	ByHitRate []HitRatePlan `json:"byHitRate,omitempty"`
}

// HitRatePlan is the fleet a hit rate needs.
type HitRatePlan struct {
	HitRate     float64 `json:"hitRate"`
	Fits        bool    `json:"fits"` // false: at this hit rate the pool cannot meet the SLO
	Replicas    int     `json:"replicas"`
	CostPerHour float64 `json:"costPerHourUSD"`
}

// ModelPlan is every pool's answer for one model, and the managed API against them.
type ModelPlan struct {
	Model             string        `json:"model"`
	Architecture      string        `json:"architecture"`
	Weights           Dtype         `json:"weights"`
	KVCache           Dtype         `json:"kvCache"`
	RequestsPerSecond float64       `json:"requestsPerSecond"`
	TTFT              time.Duration `json:"ttftTargetNanos"`
	TPOT              time.Duration `json:"tpotTargetNanos"`
	Pools             []PoolPlan    `json:"pools"`
	// Cheapest names the pool whose plan costs least per hour ("" when none fits).
	Cheapest string   `json:"cheapest"`
	Managed  *Managed `json:"managed,omitempty"`
	// Disaggregated sizes each pair of a prefill and a decode pool, for a model that disaggregates.
	Disaggregated []DisaggPlan `json:"disaggregated,omitempty"`
}

// Managed compares the cheapest pool with the model's managed fallback at its price.
type Managed struct {
	Fallback    string  `json:"fallback"`
	CostPerHour float64 `json:"costPerHourUSD"` // the workload on the managed API
	// CrossoverRequestsPerSecond is the load above which self-hosting (the cheapest pool, warm minimum
	// included) costs less; 0 with Never.
	CrossoverRequestsPerSecond float64 `json:"crossoverRequestsPerSecond"`
	Never                      bool    `json:"never"` // a replica costs more than the managed API for what it serves
}

// Plan sizes every model of the workload on each of its pools.
func Plan(snap *policies.Snapshot, w *Workload, archs map[string]Architecture) ([]ModelPlan, error) {
	var out []ModelPlan
	for _, load := range w.Models {
		m, ok := snap.Model(load.Model)
		if !ok {
			return nil, fmt.Errorf("workload model %q is not in the policy", load.Model)
		}
		mp, err := planModel(snap, w, m, load, archs[load.Model])
		if err != nil {
			return nil, err
		}
		out = append(out, mp)
	}
	return out, nil
}

func planModel(snap *policies.Snapshot, w *Workload, m *policies.Model, load ModelLoad, a Architecture) (ModelPlan, error) {
	ttft, tpot := specTargets(snap.Policy.Spec.SLO, m)
	mp := ModelPlan{Model: m.Name, Architecture: a.Name, Weights: orDtype(load.Weights), KVCache: orDtype(load.KVCache),
		RequestsPerSecond: load.RequestsPerSecond, TTFT: ttft, TPOT: tpot}
	if load.SLO.TTFT > 0 {
		mp.TTFT = load.SLO.TTFT
	}
	if load.SLO.TPOT > 0 {
		mp.TPOT = load.SLO.TPOT
	}
	best := -1
	for i := range m.Pools {
		p := &m.Pools[i]
		hc := snap.Policy.Spec.HardwareClasses[p.HardwareClass]
		gpu, ok := hc.GPU()
		pp := PoolPlan{Model: m.Name, Pool: p.Name, HardwareClass: p.HardwareClass, GPU: hc.GPUModel, GPUsPerReplica: hc.Replica()}
		if !ok {
			pp.Why = "the hardware class names no gpu (or its memory, bandwidth and FLOPS)"
		} else {
			s := sizing{a: a, load: load, w: w, gpu: gpu, gpus: hc.Replica(), maxSeqs: p.MaxConcurrency, ttft: mp.TTFT, tpot: mp.TPOT,
				costPerHour: hc.CostPerHour, maxModelLen: maxModelLen(m, a)}
			if err := s.run(&pp, load.PrefixHitRate); err != nil {
				return ModelPlan{}, err
			}
			if pp.Fits {
				for _, h := range hitRates(load.PrefixHitRate) {
					var alt PoolPlan
					if err := s.run(&alt, h); err != nil {
						return ModelPlan{}, err
					}
					pp.ByHitRate = append(pp.ByHitRate, HitRatePlan{HitRate: h, Fits: alt.Fits, Replicas: alt.Replicas, CostPerHour: alt.CostPerHour})
				}
			}
		}
		mp.Pools = append(mp.Pools, pp)
		if pp.Fits && (best < 0 || pp.CostPerHour < mp.Pools[best].CostPerHour) {
			best = len(mp.Pools) - 1
		}
	}
	if best >= 0 {
		mp.Cheapest = mp.Pools[best].Pool
		mp.Managed = managed(m, load, w, mp.Pools[best], snap)
	}
	var err error
	if mp.Disaggregated, err = disaggPlans(snap, w, m, load, a, mp.TTFT, mp.TPOT); err != nil {
		return ModelPlan{}, err
	}
	return mp, nil
}

// specTargets are the policy-wide SLO for a model (spec.slo, its model entry first); the validator has
// checked the durations.
func specTargets(slo *policies.SLO, m *policies.Model) (ttft, tpot time.Duration) {
	if slo == nil {
		return 0, 0
	}
	ttft, _ = time.ParseDuration(slo.TTFT)
	tpot, _ = time.ParseDuration(slo.TPOT)
	for _, e := range slo.Models {
		if e.Model == m.Name || slices.Contains(m.Aliases, e.Model) {
			if d, err := time.ParseDuration(e.TTFT); err == nil {
				ttft = d
			}
			if d, err := time.ParseDuration(e.TPOT); err == nil {
				tpot = d
			}
		}
	}
	return ttft, tpot
}

// maxModelLen is the context the engines run with: the policy's contextTokens, within the architecture's.
func maxModelLen(m *policies.Model, a Architecture) int {
	n := m.ContextTokens
	if n <= 0 {
		n = policies.DefaultContextTokens
	}
	if a.MaxContext > 0 {
		n = min(n, int64(a.MaxContext))
	}
	return int(n)
}

func orDtype(d Dtype) Dtype {
	if d == "" {
		return BF16
	}
	return d
}

// hitRates are the hit rates the sensitivity table shows, the workload's included.
func hitRates(measured float64) []float64 {
	hs := []float64{0, 0.25, 0.5, 0.75, 0.9}
	if !slices.Contains(hs, measured) {
		hs = append(hs, measured)
		slices.Sort(hs)
	}
	return hs
}

// sizing is one pool's arithmetic for one model's load.
type sizing struct {
	a           Architecture
	load        ModelLoad
	w           *Workload
	gpu         policies.GPUSpec
	gpus        int
	maxSeqs     int
	maxModelLen int // the engine's --max-model-len: vLLM refuses to start when the KV cache holds less
	ttft, tpot  time.Duration
	costPerHour float64

	weights, kvPerGPUToken, meanContext, flops float64
}

// run fills pp for a prefix-cache hit rate.
func (s *sizing) run(pp *PoolPlan, hit float64) error {
	a, load, t := s.a, s.load, float64(s.gpus)
	var err error
	if s.weights, err = a.WeightBytes(orDtype(load.Weights)); err != nil {
		return err
	}
	kvTok, err := a.KVBytesPerToken(orDtype(load.KVCache))
	if err != nil {
		return err
	}
	pp.KVBytesPerToken = kvTok
	// Tensor parallelism splits the KV heads (t beyond the heads replicates one each); MLA's latent is whole on
	// every GPU.
	s.kvPerGPUToken = kvTok
	if a.KVLoRARank == 0 {
		s.kvPerGPUToken = kvTok / float64(min(s.gpus, a.KVHeads))
	}
	usable := s.gpu.MemoryGiB * s.w.GPUMemoryUtilization
	pp.WeightsGiBPerGPU = s.weights / t / gib
	pp.KVPoolGiBPerGPU = usable - pp.WeightsGiBPerGPU - nonKVOverheadGiB(s.gpus)
	if pp.KVPoolGiBPerGPU <= 0 {
		pp.Why = fmt.Sprintf("the weights take %.1f GiB of the %.1f GiB each GPU gives the engine: nothing is left for KV cache", pp.WeightsGiBPerGPU, usable)
		return nil
	}
	pp.KVTokensPerReplica = int(pp.KVPoolGiBPerGPU * gib / s.kvPerGPUToken)
	if pp.KVTokensPerReplica < s.maxModelLen {
		pp.Why = fmt.Sprintf("the KV cache holds %d tokens, fewer than the %d-token context the engine is configured for (vLLM refuses to start; lower contextTokens or use more or larger GPUs)",
			pp.KVTokensPerReplica, s.maxModelLen)
		return nil
	}
	if need := load.InputTokens.P95 + load.OutputTokens.P95; float64(pp.KVTokensPerReplica) < need {
		pp.Why = fmt.Sprintf("the KV cache holds %d tokens, fewer than one p95 request's %.0f", pp.KVTokensPerReplica, need)
		return nil
	}
	s.meanContext = load.InputTokens.Mean + load.OutputTokens.Mean/2
	pp.MaxSequences = int(float64(pp.KVTokensPerReplica) / s.meanContext)
	s.flops = s.gpu.BF16TFLOPS * 1e12
	if orDtype(load.Weights) == FP8 && s.gpu.FP8TFLOPS > 0 {
		s.flops = s.gpu.FP8TFLOPS * 1e12
	}
	maxSeqs := s.maxSeqs
	if maxSeqs <= 0 {
		maxSeqs = 256 // vLLM's max_num_seqs below 70 GiB
		if s.gpu.MemoryGiB >= 70 {
			maxSeqs = 1024
		}
	}
	pp.Batch, pp.BatchLimit = pp.MaxSequences, "kv cache"
	if maxSeqs < pp.Batch {
		pp.Batch, pp.BatchLimit = maxSeqs, "max_num_seqs"
	}
	if s.tpot > 0 {
		if s.step(1) > s.tpot {
			pp.Why = fmt.Sprintf("TPOT is %v even at batch 1, above the %v target", s.step(1).Round(100*time.Microsecond), s.tpot)
			return nil
		}
		if b := s.largestBatch(pp.Batch); b < pp.Batch {
			pp.Batch, pp.BatchLimit = b, "tpot target"
		}
	}
	pp.TPOT = s.step(pp.Batch)
	pp.DecodeTokensPerSecond = float64(pp.Batch) / pp.TPOT.Seconds()
	prefill := s.prefill(load.InputTokens.Mean, hit)
	prefillP95 := s.prefill(load.InputTokens.P95, hit)
	pp.Prefill = prefill
	// GPU time per request: its prefill, and its share of the batch's decode steps.
	perRequest := prefill.Seconds() + load.OutputTokens.Mean*pp.TPOT.Seconds()/float64(pp.Batch)
	capacity := 1 / perRequest
	ttft := func(lambda float64) time.Duration {
		rho := lambda / capacity
		wait := 3 * rho * prefill.Seconds() / (2 * (1 - rho)) // p95 ≈ 3 × the M/D/1 mean wait
		return prefillP95 + time.Duration(wait*float64(time.Second))
	}
	if s.ttft > 0 && prefillP95 > s.ttft {
		pp.Why = fmt.Sprintf("a p95 prompt prefills in %v, above the %v TTFT target", prefillP95.Round(time.Millisecond), s.ttft)
		return nil
	}
	rate := capacity * 0.999
	if s.ttft > 0 && ttft(rate) > s.ttft {
		lo, hi := 0.0, rate
		for range 60 {
			mid := (lo + hi) / 2
			if ttft(mid) <= s.ttft {
				lo = mid
			} else {
				hi = mid
			}
		}
		rate = lo
	}
	pp.Fits, pp.Why = true, ""
	pp.RequestsPerSecondPerReplica = rate
	usableRate := rate * (1 - s.w.Headroom)
	pp.Replicas = max(s.w.WarmPoolMinimum, int(math.Ceil(load.RequestsPerSecond/usableRate)))
	pp.TTFTP95 = ttft(load.RequestsPerSecond / float64(pp.Replicas))
	pp.CostPerHour = float64(pp.Replicas) * s.costPerHour
	pp.CostPerMOutputTokens = pp.CostPerHour / (load.RequestsPerSecond * load.OutputTokens.Mean * 3600) * 1e6
	return nil
}

// step is one decode step at batch b: the engine's fixed cost, the all-reduces of tensor parallelism, and the
// larger of reading the weights the batch touches plus its KV (memory-bound) and the batch's FLOPs.
func (s *sizing) step(b int) time.Duration {
	t := float64(s.gpus)
	bytes := s.a.readBytes(s.weights, b)/t + s.kvPerGPUToken*float64(b)*s.meanContext
	memory := bytes / (s.gpu.DecodeEfficiency * s.gpu.MemoryBandwidthTBps * 1e12)
	compute := 2 * s.a.active() * float64(b) / t / (s.gpu.PrefillEfficiency * s.flops)
	sec := s.w.StepOverhead.Seconds() + math.Max(memory, compute)
	if s.gpus > 1 {
		sec += float64(2*s.a.Layers) * s.gpu.AllReduce.Seconds()
	}
	return time.Duration(sec * float64(time.Second))
}

// largestBatch is the largest batch up to limit whose step meets the TPOT target (step grows with the batch).
func (s *sizing) largestBatch(limit int) int {
	lo, hi := 1, limit
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if s.step(mid) <= s.tpot {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// prefill is the compute time of a prompt of n tokens with a share hit already cached: 2 × active parameters
// per new token, plus attention over everything before it (2 × layers × heads × head dim × new × (cached +
// new/2)).
func (s *sizing) prefill(n, hit float64) time.Duration {
	newTok, cached := n*(1-hit), n*hit
	dAttn := float64(s.a.Heads * s.a.HeadDim)
	flops := 2*s.a.active()*newTok + 2*float64(s.a.Layers)*dAttn*newTok*(cached+newTok/2)
	sec := s.w.StepOverhead.Seconds() + flops/(s.gpu.PrefillEfficiency*s.flops*float64(s.gpus))
	return time.Duration(sec * float64(time.Second))
}

// managed prices the workload on the model's first fallback with pricing, against the cheapest pool.
func managed(m *policies.Model, load ModelLoad, w *Workload, best PoolPlan, snap *policies.Snapshot) *Managed {
	for _, f := range m.Fallbacks {
		pr := f.Pricing
		if pr.InputPerMTok == 0 && pr.OutputPerMTok == 0 {
			continue
		}
		perRequest := (load.InputTokens.Mean*pr.InputPerMTok + load.OutputTokens.Mean*pr.OutputPerMTok) / 1e6
		out := &Managed{Fallback: f.Name, CostPerHour: load.RequestsPerSecond * 3600 * perRequest}
		replicaHour := snap.Policy.Spec.HardwareClasses[best.HardwareClass].CostPerHour
		served := best.RequestsPerSecondPerReplica * (1 - w.Headroom) * 3600 // requests a replica-hour serves
		if replicaHour > served*perRequest {
			out.Never = true
			return out
		}
		// Below the warm minimum's worth of traffic the fixed fleet costs more than paying per request.
		out.CrossoverRequestsPerSecond = float64(w.WarmPoolMinimum) * replicaHour / (3600 * perRequest)
		return out
	}
	return nil
}
