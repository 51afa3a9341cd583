// Package capacity sizes a fleet from the KV-cache wall: how much KV a replica of each hardware class keeps
// after the weights, how many sequences that holds, how fast it decodes and prefills at that batch, and so
// how many replicas a workload needs within its SLO and what they cost against the managed API. It also
// reads a running gateway's view of the fleet (Live) and turns load into desired replicas (Autoscaler).
package capacity

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Architecture is what the arithmetic needs of a model: its shape (Hugging Face config.json names) and size.
type Architecture struct {
	Name                   string
	Layers                 int
	Heads, KVHeads         int
	HeadDim                int
	Hidden, Intermediate   int
	Vocab                  int
	TiedEmbeddings         bool
	Parameters             float64 // all weights
	ActiveParameters       float64 // per token (MoE); equals Parameters for a dense model
	Experts, ExpertsPerTok int     // routed experts (0: dense)
	// KVLoRARank and RoPEHeadDim describe multi-head latent attention (DeepSeek-V2/V3): per layer and token the
	// cache holds one latent of KVLoRARank plus the RoPE key, for all heads, and tensor parallelism does not
	// divide it.
	KVLoRARank, RoPEHeadDim int
	MaxContext              int
}

// Presets are published configs of common open-weight families (their config.json on Hugging Face).
var Presets = map[string]Architecture{
	"llama-3.1-8b": {Name: "llama-3.1-8b", Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128, Hidden: 4096, Intermediate: 14336,
		Vocab: 128256, Parameters: 8.03e9, MaxContext: 131072},
	"llama-3.3-70b": {Name: "llama-3.3-70b", Layers: 80, Heads: 64, KVHeads: 8, HeadDim: 128, Hidden: 8192, Intermediate: 28672,
		Vocab: 128256, Parameters: 70.6e9, MaxContext: 131072},
	"qwen2.5-7b": {Name: "qwen2.5-7b", Layers: 28, Heads: 28, KVHeads: 4, HeadDim: 128, Hidden: 3584, Intermediate: 18944,
		Vocab: 152064, Parameters: 7.62e9, MaxContext: 32768},
	"qwen2.5-32b": {Name: "qwen2.5-32b", Layers: 64, Heads: 40, KVHeads: 8, HeadDim: 128, Hidden: 5120, Intermediate: 27648,
		Vocab: 152064, Parameters: 32.5e9, MaxContext: 32768},
	"mixtral-8x7b": {Name: "mixtral-8x7b", Layers: 32, Heads: 32, KVHeads: 8, HeadDim: 128, Hidden: 4096, Intermediate: 14336,
		Vocab: 32000, Parameters: 46.7e9, ActiveParameters: 12.9e9, Experts: 8, ExpertsPerTok: 2, MaxContext: 32768},
	"deepseek-v3": {Name: "deepseek-v3", Layers: 61, Heads: 128, HeadDim: 192, Hidden: 7168, Vocab: 129280,
		Parameters: 671e9, ActiveParameters: 37e9, Experts: 256, ExpertsPerTok: 8, KVLoRARank: 512, RoPEHeadDim: 64, MaxContext: 163840},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string { return slices.Sorted(maps.Keys(Presets)) }

// Dtype is a storage type of weights or KV cache.
type Dtype string

// Storage types.
const (
	BF16 Dtype = "bf16"
	FP8  Dtype = "fp8"
	INT4 Dtype = "int4"
)

// bytesPerElement of a KV-cache dtype (INT4 KV caches are not a thing engines ship).
func (d Dtype) kvBytes() (float64, error) {
	switch d {
	case BF16, "":
		return 2, nil
	case FP8:
		return 1, nil
	}
	return 0, fmt.Errorf("KV cache dtype %q: bf16 or fp8", d)
}

// KVBytesPerToken is the KV cache one token takes across the whole model:
// 2 (K and V) × layers × KV heads × head dimension × bytes per element; with MLA, layers × (latent + RoPE key)
// × bytes.
func (a Architecture) KVBytesPerToken(kv Dtype) (float64, error) {
	b, err := kv.kvBytes()
	if err != nil {
		return 0, err
	}
	if a.KVLoRARank > 0 {
		return float64(a.Layers*(a.KVLoRARank+a.RoPEHeadDim)) * b, nil
	}
	return 2 * float64(a.Layers*a.KVHeads*a.HeadDim) * b, nil
}

// embeddingParams are the input embedding and the output head (one matrix when tied).
func (a Architecture) embeddingParams() float64 {
	n := float64(a.Vocab) * float64(a.Hidden)
	if a.TiedEmbeddings {
		return n
	}
	return 2 * n
}

// WeightBytes is the checkpoint's size in a dtype: BF16 2 bytes a parameter; FP8 (W8A8) 1, with the
// embeddings and output head kept in BF16; INT4 (W4A16, group-128 FP16 scales) 0.5 + 2/128, embeddings in BF16.
func (a Architecture) WeightBytes(w Dtype) (float64, error) {
	emb := a.embeddingParams()
	rest := a.Parameters - emb
	switch w {
	case BF16, "":
		return 2 * a.Parameters, nil
	case FP8:
		return rest + 2*emb, nil
	case INT4:
		return rest*(0.5+2.0/128) + 2*emb, nil
	}
	return 0, fmt.Errorf("weights dtype %q: bf16, fp8 or int4", w)
}

// readBytes is the weight bytes one decode step reads at batch b: all of a dense model; for a MoE, the
// shared part and the routed experts the batch touches, 1 − (1 − k/E)^b of them.
func (a Architecture) readBytes(weights float64, b int) float64 {
	if a.Experts == 0 || a.ActiveParameters <= 0 || a.ActiveParameters >= a.Parameters {
		return weights
	}
	e, k := float64(a.Experts), float64(a.ExpertsPerTok)
	expertShare := (a.Parameters - a.ActiveParameters) * e / (e - k) / a.Parameters // routed experts' share of all weights
	touched := 1 - pow(1-k/e, b)
	return weights * (1 - expertShare + expertShare*touched)
}

func pow(x float64, n int) float64 {
	r := 1.0
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			r *= x
		}
		x *= x
	}
	return r
}

// active is the parameters a token computes with.
func (a Architecture) active() float64 {
	if a.ActiveParameters > 0 {
		return a.ActiveParameters
	}
	return a.Parameters
}

// hfConfig is the part of a Hugging Face config.json the arithmetic reads.
type hfConfig struct {
	ModelType         string `json:"model_type"`
	Layers            int    `json:"num_hidden_layers"`
	Heads             int    `json:"num_attention_heads"`
	KVHeads           int    `json:"num_key_value_heads"`
	HeadDim           int    `json:"head_dim"`
	Hidden            int    `json:"hidden_size"`
	Intermediate      int    `json:"intermediate_size"`
	MoEIntermediate   int    `json:"moe_intermediate_size"`
	Vocab             int    `json:"vocab_size"`
	Tied              bool   `json:"tie_word_embeddings"`
	MaxPositions      int    `json:"max_position_embeddings"`
	LocalExperts      int    `json:"num_local_experts"`
	NumExperts        int    `json:"num_experts"` // Qwen-MoE
	SharedExpertInter int    `json:"shared_expert_intermediate_size"`
	RoutedExperts     int    `json:"n_routed_experts"`
	SharedExperts     int    `json:"n_shared_experts"`
	ExpertsPerTok     int    `json:"num_experts_per_tok"`
	KVLoRARank        int    `json:"kv_lora_rank"`
	QKRoPEHeadDim     int    `json:"qk_rope_head_dim"`
	QKNoPEHeadDim     int    `json:"qk_nope_head_dim"`
	FirstDenseLayers  int    `json:"first_k_dense_replace"`
}

// maxConfigBytes bounds a config.json; real ones are a few kilobytes.
const maxConfigBytes = 1 << 20

// limits on a config's numbers: far above any published model, low enough that products cannot overflow.
const (
	maxDim    = 1 << 20
	maxLayers = 4096
)

// ParseHFConfig reads a Hugging Face config.json. The parameter count is estimated from the shapes (embeddings,
// attention, MLP or experts per layer) unless parameters (and, for a MoE, activeParameters) are given; the
// estimate is within a few percent of published counts for Llama, Qwen and Mixtral layouts, and MLA models
// need the published counts.
func ParseHFConfig(name string, b []byte, parameters, activeParameters float64) (Architecture, error) {
	if len(b) > maxConfigBytes {
		return Architecture{}, fmt.Errorf("config %s: over %d bytes", name, maxConfigBytes)
	}
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return Architecture{}, fmt.Errorf("config %s: %w", name, err)
	}
	a := Architecture{Name: name, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Hidden: c.Hidden,
		Intermediate: c.Intermediate, Vocab: c.Vocab, TiedEmbeddings: c.Tied, MaxContext: c.MaxPositions,
		Experts: max(c.LocalExperts, c.RoutedExperts, c.NumExperts), ExpertsPerTok: c.ExpertsPerTok, KVLoRARank: c.KVLoRARank, RoPEHeadDim: c.QKRoPEHeadDim}
	if a.KVHeads == 0 {
		a.KVHeads = a.Heads
	}
	if a.HeadDim == 0 && a.Heads > 0 {
		a.HeadDim = a.Hidden / a.Heads
	}
	if a.KVLoRARank > 0 {
		a.HeadDim = c.QKNoPEHeadDim + c.QKRoPEHeadDim
	}
	var problems []string
	for _, f := range []struct {
		name     string
		v, limit int
	}{{"num_hidden_layers", a.Layers, maxLayers}, {"num_attention_heads", a.Heads, maxDim}, {"hidden_size", a.Hidden, maxDim},
		{"vocab_size", a.Vocab, 1 << 24}, {"head_dim", a.HeadDim, maxDim}, {"num_key_value_heads", a.KVHeads, maxDim}} {
		if f.v <= 0 || f.v > f.limit {
			problems = append(problems, fmt.Sprintf("%s must be between 1 and %d, got %d", f.name, f.limit, f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"intermediate_size", a.Intermediate}, {"moe_intermediate_size", c.MoEIntermediate}, {"kv_lora_rank", a.KVLoRARank},
		{"qk_rope_head_dim", a.RoPEHeadDim}, {"max_position_embeddings", a.MaxContext}, {"num_experts_per_tok", a.ExpertsPerTok},
		{"experts", a.Experts}, {"n_shared_experts", c.SharedExperts}, {"first_k_dense_replace", c.FirstDenseLayers},
		{"shared_expert_intermediate_size", c.SharedExpertInter}} {
		if f.v < 0 || f.v > 1<<24 {
			problems = append(problems, fmt.Sprintf("%s must be between 0 and %d, got %d", f.name, 1<<24, f.v))
		}
	}
	if a.Experts > 0 && (a.ExpertsPerTok <= 0 || a.ExpertsPerTok > a.Experts) {
		problems = append(problems, fmt.Sprintf("num_experts_per_tok must be between 1 and the %d experts, got %d", a.Experts, a.ExpertsPerTok))
	}
	if len(problems) > 0 {
		return Architecture{}, fmt.Errorf("config %s: %s", name, strings.Join(problems, "; "))
	}
	a.Parameters, a.ActiveParameters = parameters, activeParameters
	if a.Parameters == 0 {
		if a.KVLoRARank > 0 {
			return Architecture{}, errors.New("config " + name + ": a multi-head latent attention model needs its published parameters and activeParameters")
		}
		a.Parameters, a.ActiveParameters = a.estimate(c)
	}
	if a.ActiveParameters == 0 {
		a.ActiveParameters = a.Parameters
	}
	return a, nil
}

// estimate counts parameters from the shapes: embeddings, per layer Q/K/V/O projections and a gated MLP (three
// matrices) or, for a MoE, its experts' MLPs (routed and shared) of which a token uses k.
func (a Architecture) estimate(c hfConfig) (total, active float64) {
	h, hd := float64(a.Hidden), float64(a.HeadDim)
	attn := h*float64(a.Heads)*hd*2 + 2*h*float64(a.KVHeads)*hd
	mlp := 3 * h * float64(a.Intermediate)
	perLayerTotal, perLayerActive := attn+mlp, attn+mlp
	if a.Experts > 0 {
		inter := float64(max(c.MoEIntermediate, 0))
		if inter == 0 {
			inter = float64(a.Intermediate)
		}
		expert := 3 * h * inter
		shared := float64(c.SharedExperts)*expert + 3*h*float64(c.SharedExpertInter)
		perLayerTotal = attn + float64(a.Experts)*expert + shared
		perLayerActive = attn + float64(a.ExpertsPerTok)*expert + shared
	}
	emb := a.embeddingParams()
	layers := float64(a.Layers)
	return emb + layers*perLayerTotal, emb + layers*perLayerActive
}
