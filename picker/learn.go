package picker

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/openai"
)

// Observe implements Picker. It keeps an exponentially weighted mean of estimated ÷ real prompt tokens, so
// that the index holds as much prompt text as the engine's KV cache really does and prefill times use real
// tokens. And when the engine served far fewer cached tokens than the index promised, the engine evicted the
// prefix (or another gateway's traffic did): the index forgets it there, and the prefix is placed again as a
// new one, where the other gateway replicas place it.
func (p *Affinity) Observe(d Decision, u openai.Usage) {
	if len(d.Endpoints) > 0 && d.ServedBy != "" && d.ServedBy != d.Endpoints[0] {
		// Envoy retried the request elsewhere: the chosen endpoint never saw the prompt, so what the index
		// recorded there is not true. The served endpoint's cache is learnt from its own later answers.
		p.forget(d.Endpoints[0], d)
	} else if u.CachedReported && d.ExpectedCachedTokens > 0 && len(d.Endpoints) > 0 && 2*u.CachedTokens < int64(d.ExpectedCachedTokens) {
		p.forget(d.Endpoints[0], d)
	}
	p.observeChurn(d, u)
	estimated, real := d.EstimatedPromptTokens, int(u.PromptTokens)
	if estimated <= 0 || real <= 0 {
		return
	}
	sample := min(8, max(0.125, float64(estimated)/float64(real)))
	updateFloat(&p.scale, func(prev float64, set bool) float64 {
		if !set {
			return sample
		}
		return 0.95*prev + 0.05*sample
	})
}

// updateFloat replaces the float64 held in a's bits by next(the held value, whether one is held: 0 bits mean
// unset), atomically, and returns what it replaced: the learnt averages shared by every decision are kept so.
func updateFloat(a *atomic.Uint64, next func(prev float64, set bool) float64) (prev float64, set bool) {
	for {
		old := a.Load()
		prev, set = math.Float64frombits(old), old != 0
		if a.CompareAndSwap(old, math.Float64bits(next(prev, set))) {
			return prev, set
		}
	}
}

// ObserveTiming implements Picker: the chosen endpoint's model (or the fallback's) is fitted to the
// measured time from routing to the first token and time per output token, and the pool's calibration and
// the model's trust to whether it met its target. A request Envoy retried elsewhere teaches nothing: it was
// predicted for another endpoint.
func (p *Affinity) ObserveTiming(model string, d Decision, ttft, tpot time.Duration) {
	if !d.Predicted.set {
		return
	}
	if d.Fallback != nil {
		p.pred.observeManaged(contract.FallbackClusterName(model, d.Fallback.Name), ttft)
		return
	}
	if len(d.Endpoints) == 0 || (d.ServedBy != "" && d.ServedBy != d.Endpoints[0]) {
		return
	}
	if d.Prefill != "" {
		// A split request's TTFT is its prefiller's, the transfer and the decode leg's wait for a place in its
		// decoder's batch: not what either replica's TTFT model predicts (fitting the prefiller's to it cost
		// make bench-pd's per-request row a fifth of its goodput at 32 req/s), nor what the decoder's pool's
		// calibration judges. Its TPOT is the decoder's.
		p.pred.observe(d.Endpoints[0], d.Predicted, 0, tpot)
		return
	}
	engine, engineTTFT := d.Predicted.atEngine(ttft)
	p.pred.observe(d.Endpoints[0], engine, engineTTFT, tpot)
	p.pred.noteRatio(model, engineTTFT, engine.TTFT)
	if pd := d.Predicted; pd.inTime && d.Pool != nil {
		missed := ttft > pd.limit || (pd.tpotLimit > 0 && tpot > pd.tpotLimit)
		key := poolKey{model, d.Pool.Name}
		factor := p.pred.calibrate(key, missed, pd.objective)
		p.Metrics.margin(key, pd.margin*factor)
	}
}

// Prefilled implements Picker: the request is forgotten among its endpoint's sends still in prefill, here and,
// when it was published as a long prompt, at the other replicas (once: the director reports it at the first
// token and again as the request settles, which also covers a request that failed before its first token).
func (p *Affinity) Prefilled(d Decision) {
	var released, prefillReleased bool
	if d.Predicted.set && d.Fallback == nil && len(d.Endpoints) > 0 {
		released = p.pred.prefilled(d.Endpoints[0], d.Predicted)
	}
	if d.prefillPred.set {
		prefillReleased = p.pred.prefilled(d.Prefill, d.prefillPred)
	}
	p.publishDone(&d, released, prefillReleased)
}

// noteSharing records whether a prompt matched a prefix held somewhere and returns the share of recent
// prompts that did (before this one).
func (p *Affinity) noteSharing(matched bool) float64 {
	sample := indicator(matched)
	prev, set := updateFloat(&p.sharing, func(prev float64, set bool) float64 {
		if !set {
			prev = initialSharing
		}
		return max(prev+(sample-prev)/sharingWindow, 1e-9) // never 0, which means unset
	})
	if !set {
		return initialSharing
	}
	return prev
}

// tokenScale is estimated ÷ real tokens (1 until Observe has data).
func (p *Affinity) tokenScale() float64 {
	if b := p.scale.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}
