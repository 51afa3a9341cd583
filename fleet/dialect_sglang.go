package fleet

import (
	"strconv"

	dto "github.com/prometheus/client_model/go"
)

// sglang reads SGLang's metrics (the sglang: prefix; KV blocks are pages).
type sglang struct{}

func (sglang) Name() string { return "sglang" }

func (sglang) Read(f map[string]*dto.MetricFamily) EngineMetrics {
	em := EngineMetrics{
		Running:            sum(f, "sglang:num_running_reqs"),
		Waiting:            sum(f, "sglang:num_queue_reqs"),
		KVUtil:             sum(f, "sglang:token_usage"),
		PromptTokens:       tokenCounter(f, "sglang:prompt_tokens_total"),
		CachedPromptTokens: tokenCounter(f, "sglang:cached_tokens_total"),
	}
	if m, ok := first(f, "sglang:cache_config_info"); ok {
		em.BlockSize, _ = strconv.Atoi(Label(m, "page_size"))
		em.NumBlocks, _ = strconv.Atoi(Label(m, "num_pages"))
	}
	em.Version = buildVersion(f, "sglang:build_info")
	return em
}
