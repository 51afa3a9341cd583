package fleet

import (
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// vllm reads vLLM's metrics (the vllm: prefix).
type vllm struct{}

func (vllm) Name() string { return "vllm" }

func (vllm) Read(f map[string]*dto.MetricFamily) EngineMetrics {
	em := EngineMetrics{
		Running: sum(f, "vllm:num_requests_running"),
		Waiting: sum(f, "vllm:num_requests_waiting"),
		// vLLM before 0.10 exported gpu_cache_usage_perc.
		KVUtil:       sum(f, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
		PromptTokens: tokenCounter(f, "vllm:prompt_tokens_total"),
		// A KV cache pulled through a connector (a P/D decoder's, an offload tier's) counts as external hits.
		CachedPromptTokens: min(tokenCounter(f, "vllm:prefix_cache_hits_total")+tokenCounter(f, "vllm:external_prefix_cache_hits_total"), MaxTokenCount),
	}
	if m, ok := first(f, "vllm:cache_config_info"); ok {
		em.BlockSize, _ = strconv.Atoi(Label(m, "block_size"))
		em.NumBlocks, _ = strconv.Atoi(Label(m, "num_gpu_blocks"))
	}
	if m, ok := first(f, "vllm:lora_requests_info"); ok {
		for _, a := range strings.Split(Label(m, "running_lora_adapters"), ",") {
			if a = strings.TrimSpace(a); a != "" {
				em.LoRAs = append(em.LoRAs, a)
			}
		}
	}
	em.Version = buildVersion(f, "vllm:build_info")
	return em
}
