package fleet

import (
	dto "github.com/prometheus/client_model/go"
)

// trtllm reads TensorRT-LLM's metrics (the trtllm_ prefix; no build_info, so Version stays "").
type trtllm struct{}

func (trtllm) Name() string { return "trtllm" }

func (trtllm) Read(f map[string]*dto.MetricFamily) EngineMetrics {
	em := EngineMetrics{
		Running: sum(f, "trtllm_num_requests_running"),
		Waiting: sum(f, "trtllm_num_requests_waiting"),
		KVUtil:  sum(f, "trtllm_kv_cache_utilization"),
	}
	em.BlockSize = int(sum(f, "trtllm_kv_cache_tokens_per_block"))
	em.NumBlocks = int(sum(f, "trtllm_kv_cache_max_blocks"))
	return em
}
