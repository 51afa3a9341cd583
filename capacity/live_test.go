package capacity

import (
	"strings"
	"testing"
	"time"
)

const before = `# TYPE infergate_endpoint_kv_cache_usage_ratio gauge
infergate_endpoint_kv_cache_usage_ratio{model="m",pool="p",endpoint="e1"} 0.2
infergate_endpoint_kv_cache_usage_ratio{model="m",pool="p",endpoint="e2"} 0.4
# TYPE infergate_endpoint_kv_cache_capacity_tokens gauge
infergate_endpoint_kv_cache_capacity_tokens{model="m",pool="p",endpoint="e1"} 1000
infergate_endpoint_kv_cache_capacity_tokens{model="m",pool="p",endpoint="e2"} 3000
# TYPE infergate_pool_tokens_total counter
infergate_pool_tokens_total{model="m",pool="p",hardware_class="h",kind="prompt"} 1000
infergate_pool_tokens_total{model="m",pool="p",hardware_class="h",kind="cached"} 500
`

const after = `# TYPE infergate_endpoint_kv_cache_usage_ratio gauge
infergate_endpoint_kv_cache_usage_ratio{model="m",pool="p",endpoint="e1"} 0.4
infergate_endpoint_kv_cache_usage_ratio{model="m",pool="p",endpoint="e2"} 0.6
# TYPE infergate_endpoint_kv_cache_capacity_tokens gauge
infergate_endpoint_kv_cache_capacity_tokens{model="m",pool="p",endpoint="e1"} 1000
infergate_endpoint_kv_cache_capacity_tokens{model="m",pool="p",endpoint="e2"} 3000
# TYPE infergate_endpoint_waiting_requests gauge
infergate_endpoint_waiting_requests{model="m",pool="p",endpoint="e1"} 3
# TYPE infergate_pool_tokens_total counter
infergate_pool_tokens_total{model="m",pool="p",hardware_class="h",kind="prompt"} 2000
infergate_pool_tokens_total{model="m",pool="p",hardware_class="h",kind="cached"} 1250
# TYPE gen_ai_server_time_to_first_token_seconds histogram
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="p",le="0.1"} 90
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="p",le="0.5"} 100
gen_ai_server_time_to_first_token_seconds_bucket{gen_ai_request_model="m",pool="p",le="+Inf"} 100
gen_ai_server_time_to_first_token_seconds_sum{gen_ai_request_model="m",pool="p"} 5
gen_ai_server_time_to_first_token_seconds_count{gen_ai_request_model="m",pool="p"} 100
`

// Two readings a minute apart: capacity-weighted KV use, its growth and the time to the wall, the interval's
// hit rate, request rate and TTFT p95.
func TestCompareReadings(t *testing.T) {
	b, err := ParseExposition(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := ParseExposition(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	r := Compare(b, a, time.Minute)
	if len(r.Pools) != 1 {
		t.Fatalf("%+v", r)
	}
	p := r.Pools[0]
	// (0.4×1000 + 0.6×3000) ÷ 4000 = 0.55, from 0.35: +0.2 a minute, 0.45 left: 2m15s.
	within(t, "KV usage", p.KVUsage, 0.55, 1e-9)
	within(t, "KV growth", p.KVGrowthPerMinute, 0.2, 1e-9)
	if p.KVCapacityTokens != 4000 || p.Waiting != 3 || p.Replicas != 2 || p.UntilWall.Round(time.Second) != 135*time.Second || r.FirstWall != "m/p" {
		t.Errorf("%+v %+v", p, r)
	}
	within(t, "hit rate", p.HitRate, 0.75, 1e-9)
	// The first reading had no histogram: the whole count is the interval's (100 in a minute); p95 in the
	// 0.5 s bucket.
	if p.TTFTP95 != 500*time.Millisecond {
		t.Errorf("TTFT p95 %v", p.TTFTP95)
	}
	within(t, "requests per second", p.RequestsPerSecond, 100.0/60, 1e-9)
	// A counter reset between the readings (a restarted gateway) gives no hit rate rather than a negative one.
	if r := Compare(a, b, time.Minute); r.Pools[0].HitRate != 0 || r.Pools[0].UntilWall != 0 {
		t.Errorf("reversed: %+v", r.Pools[0])
	}
}

func FuzzCompare(f *testing.F) {
	f.Add(before, after)
	f.Add("", "x 1\n")
	f.Fuzz(func(t *testing.T, x, y string) {
		b, err := ParseExposition(strings.NewReader(x))
		if err != nil {
			return
		}
		a, err := ParseExposition(strings.NewReader(y))
		if err != nil {
			return
		}
		r := Compare(b, a, time.Minute)
		for _, p := range r.Pools {
			if p.UntilWall < 0 || p.HitRate < 0 || p.HitRate > 1 {
				t.Fatalf("%+v", p)
			}
		}
	})
}
