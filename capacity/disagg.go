package capacity

import (
	"fmt"
	"math"
	"time"

	"github.com/infergate/infergate/policies"
)

// DisaggPlan sizes a disaggregated model (spec.models[].disaggregation, docs/disaggregation.md) as a pair of
// pools: one that prefills every request and one that decodes it, the KV cache moved between them. The ratio
// of their replicas follows the workload: long prompts need more prefill replicas per decode replica, long
// answers fewer.
type DisaggPlan struct {
	PrefillPool string `json:"prefillPool"`
	DecodePool  string `json:"decodePool"`
	Fits        bool   `json:"fits"`
	Why         string `json:"why,omitempty"`
	// Per replica: the prefill pool's requests a second within the TTFT target (prefill, its queue, the
	// transfer and the decoder's first step), the decode pool's within the TPOT target (its batch ÷ a mean
	// answer's decode time).
	PrefillRequestsPerSecondPerReplica float64       `json:"prefillRequestsPerSecondPerReplica"`
	DecodeRequestsPerSecondPerReplica  float64       `json:"decodeRequestsPerSecondPerReplica"`
	PrefillReplicas                    int           `json:"prefillReplicas"`
	DecodeReplicas                     int           `json:"decodeReplicas"`
	DecodeBatch                        int           `json:"decodeBatch"`
	TPOT                               time.Duration `json:"tpotNanos"`
	TransferP95                        time.Duration `json:"transferP95Nanos"` // a p95 prompt's uncached KV over the link
	TTFTP95                            time.Duration `json:"ttftP95Nanos"`
	CostPerHour                        float64       `json:"costPerHourUSD"`
	CostPerMOutputTokens               float64       `json:"costPerMOutputTokensUSD"`
}

// disaggPlans sizes every pair of a pool that prefills and another that decodes, for a disaggregated model.
func disaggPlans(snap *policies.Snapshot, w *Workload, m *policies.Model, load ModelLoad, a Architecture, ttft, tpot time.Duration) ([]DisaggPlan, error) {
	if m.Disaggregation == nil {
		return nil, nil
	}
	var out []DisaggPlan
	for i := range m.Pools {
		p := &m.Pools[i]
		if !p.Prefills() {
			continue
		}
		for j := range m.Pools {
			d := &m.Pools[j]
			if i == j || !d.ServesWhole() {
				continue
			}
			dp, err := disaggPair(snap, w, m, load, a, p, d, ttft, tpot)
			if err != nil {
				return nil, err
			}
			out = append(out, dp)
		}
	}
	return out, nil
}

// poolSizing is the arithmetic of one pool for the load, with the targets given (0: none).
func poolSizing(snap *policies.Snapshot, w *Workload, m *policies.Model, load ModelLoad, a Architecture, p *policies.Pool, ttft, tpot time.Duration) (*sizing, PoolPlan, error) {
	hc := snap.Policy.Spec.HardwareClasses[p.HardwareClass]
	pp := PoolPlan{Pool: p.Name}
	gpu, ok := hc.GPU()
	if !ok {
		pp.Why = "the hardware class names no gpu (or its memory, bandwidth and FLOPS)"
		return nil, pp, nil
	}
	s := &sizing{a: a, load: load, w: w, gpu: gpu, gpus: hc.Replica(), maxSeqs: p.MaxConcurrency, ttft: ttft, tpot: tpot,
		costPerHour: hc.CostPerHour, maxModelLen: maxModelLen(m, a)}
	err := s.run(&pp, load.PrefixHitRate)
	return s, pp, err
}

// disaggPair sizes prefill pool p with decode pool d. The decode pool runs at the largest batch its KV cache,
// max_num_seqs and the TPOT target allow, with no prefill sharing its steps; the prefill pool is an M/D/1
// queue of prefills whose p95 wait, with a p95 prompt's prefill and transfer and the decoder's first step, must
// meet the TTFT target.
func disaggPair(snap *policies.Snapshot, w *Workload, m *policies.Model, load ModelLoad, a Architecture, p, d *policies.Pool, ttft, tpot time.Duration) (DisaggPlan, error) {
	dp := DisaggPlan{PrefillPool: p.Name, DecodePool: d.Name}
	sp, pre, err := poolSizing(snap, w, m, load, a, p, 0, 0)
	if err != nil || !pre.Fits {
		dp.Why = "the prefill pool cannot hold the model: " + pre.Why
		return dp, err
	}
	_, dec, err := poolSizing(snap, w, m, load, a, d, 0, tpot)
	if err != nil || !dec.Fits {
		dp.Why = "the decode pool cannot serve the model: " + dec.Why
		return dp, err
	}
	gbps := m.Disaggregation.TransferGbps
	if gbps <= 0 {
		gbps = policies.DefaultDisaggTransferGbps
	}
	hit := load.PrefixHitRate
	dp.TransferP95 = time.Duration(load.InputTokens.P95 * (1 - hit) * pre.KVBytesPerToken * 8 / (gbps * 1e9) * float64(time.Second))
	prefill := sp.prefill(load.InputTokens.Mean, hit)
	fixed := sp.prefill(load.InputTokens.P95, hit) + dp.TransferP95 + dec.TPOT
	ttftAt := func(lambda float64) time.Duration {
		rho := lambda * prefill.Seconds()
		return fixed + time.Duration(3*rho*prefill.Seconds()/(2*(1-rho))*float64(time.Second))
	}
	if ttft > 0 && fixed > ttft {
		dp.Why = fmt.Sprintf("a p95 prompt's prefill, transfer and first decode step take %v, above the %v TTFT target", fixed.Round(time.Millisecond), ttft)
		return dp, nil
	}
	rate := 0.999 / prefill.Seconds()
	if ttft > 0 && ttftAt(rate) > ttft {
		lo, hi := 0.0, rate
		for range 60 {
			if mid := (lo + hi) / 2; ttftAt(mid) <= ttft {
				lo = mid
			} else {
				hi = mid
			}
		}
		rate = lo
	}
	dp.Fits = true
	dp.PrefillRequestsPerSecondPerReplica = rate
	dp.DecodeBatch, dp.TPOT = dec.Batch, dec.TPOT
	dp.DecodeRequestsPerSecondPerReplica = float64(dec.Batch) / (load.OutputTokens.Mean * dec.TPOT.Seconds())
	replicas := func(perReplica float64) int {
		return max(w.WarmPoolMinimum, int(math.Ceil(load.RequestsPerSecond/(perReplica*(1-w.Headroom)))))
	}
	dp.PrefillReplicas, dp.DecodeReplicas = replicas(rate), replicas(dp.DecodeRequestsPerSecondPerReplica)
	dp.TTFTP95 = ttftAt(load.RequestsPerSecond / float64(dp.PrefillReplicas))
	hcP, hcD := snap.Policy.Spec.HardwareClasses[p.HardwareClass], snap.Policy.Spec.HardwareClasses[d.HardwareClass]
	dp.CostPerHour = float64(dp.PrefillReplicas)*hcP.CostPerHour + float64(dp.DecodeReplicas)*hcD.CostPerHour
	dp.CostPerMOutputTokens = dp.CostPerHour / (load.RequestsPerSecond * load.OutputTokens.Mean * 3600) * 1e6
	return dp, nil
}
