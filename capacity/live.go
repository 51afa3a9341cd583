package capacity

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/infergate/infergate/fleet"
)

// maxExposition bounds a gateway's /metrics read by --live; maxWallMinutes is the farthest wall reported (a
// year): slower growth is no growth.
const (
	maxExposition  = 64 << 20
	maxWallMinutes = 365 * 24 * 60
)

// LivePool is one pool as a running gateway sees it, over the interval between two readings.
type LivePool struct {
	Model, Pool string
	Replicas    int `json:"replicas"` // endpoints with a fresh engine reading
	// KVCapacityTokens is the pool's KV cache (0 when its engines export no cache geometry); KVUsage the mean
	// share in use now, KVGrowthPerMinute its change.
	KVCapacityTokens  float64 `json:"kvCapacityTokens"`
	KVUsage           float64 `json:"kvUsage"`
	KVGrowthPerMinute float64 `json:"kvGrowthPerMinute"`
	Waiting, Running  float64
	// RequestsPerSecond, HitRate (cached ÷ prompt tokens) and TTFTP95 are the interval's.
	RequestsPerSecond float64       `json:"requestsPerSecond"`
	HitRate           float64       `json:"hitRate"`
	TTFTP95           time.Duration `json:"ttftP95Nanos"`
	// Headroom is the share of the KV cache still free; UntilWall how long until it is full at the interval's
	// growth (0 when it is not growing).
	Headroom  float64       `json:"headroom"`
	UntilWall time.Duration `json:"untilWallNanos"`
	// DesiredReplicas is the gateway's autoscaling signal for the pool (0 when it exports none).
	DesiredReplicas float64 `json:"desiredReplicas"`
}

// LiveReport is every pool, and the one that reaches the KV wall first.
type LiveReport struct {
	Interval   time.Duration `json:"intervalNanos"`
	Pools      []LivePool    `json:"pools"`
	FirstWall  string        `json:"firstToWall"` // model/pool, "" when no pool's KV use is growing
	FirstAfter time.Duration `json:"firstToWallAfterNanos"`
}

// ReadLive reads a gateway's /metrics twice, interval apart.
func ReadLive(ctx context.Context, addr string, interval time.Duration) (*LiveReport, error) {
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	if !strings.HasSuffix(url, "/metrics") {
		url = strings.TrimSuffix(url, "/") + "/metrics"
	}
	before, err := scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(interval):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	after, err := scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	return Compare(before, after, interval), nil
}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %d", url, resp.StatusCode)
	}
	return ParseExposition(io.LimitReader(resp.Body, maxExposition))
}

// ParseExposition reads the Prometheus text format (fleet.ParseFamilies: prometheus/common's parser).
func ParseExposition(r io.Reader) (map[string]*dto.MetricFamily, error) {
	return fleet.ParseFamilies(r)
}

type poolKey struct{ model, pool string }

// eachPool calls fn with every sample of a family and its pool (by the model/pool labels given).
func eachPool(fams map[string]*dto.MetricFamily, name, modelLabel string, fn func(poolKey, *dto.Metric)) {
	f := fams[name]
	if f == nil {
		return
	}
	for _, m := range f.GetMetric() {
		fn(poolKey{fleet.Label(m, modelLabel), fleet.Label(m, "pool")}, m)
	}
}

// Compare turns two readings of a gateway's metrics into the live report.
func Compare(before, after map[string]*dto.MetricFamily, interval time.Duration) *LiveReport {
	pools := map[poolKey]*LivePool{}
	get := func(k poolKey) *LivePool {
		if pools[k] == nil {
			pools[k] = &LivePool{Model: k.model, Pool: k.pool}
		}
		return pools[k]
	}
	used0, used1 := readKV(before), readKV(after)
	for k, v := range used1 {
		p := get(k)
		p.KVUsage, p.KVCapacityTokens, p.Replicas = v.usage(), v.capacity, v.endpoints
		if old, ok := used0[k]; ok && old.weight > 0 && interval > 0 {
			p.KVGrowthPerMinute = (p.KVUsage - old.usage()) / interval.Minutes()
		}
	}
	eachPool(after, "infergate_endpoint_waiting_requests", "model", func(k poolKey, m *dto.Metric) { get(k).Waiting += fleet.Value(m) })
	eachPool(after, "infergate_endpoint_running_requests", "model", func(k poolKey, m *dto.Metric) { get(k).Running += fleet.Value(m) })
	eachPool(after, "infergate_pool_desired_replicas", "model", func(k poolKey, m *dto.Metric) { get(k).DesiredReplicas = fleet.Value(m) })
	tokens := func(fams map[string]*dto.MetricFamily, kind string) map[poolKey]float64 {
		out := map[poolKey]float64{}
		eachPool(fams, "infergate_pool_tokens_total", "model", func(k poolKey, m *dto.Metric) {
			if fleet.Label(m, "kind") == kind {
				out[k] += fleet.Value(m)
			}
		})
		return out
	}
	p0, p1, c0, c1 := tokens(before, "prompt"), tokens(after, "prompt"), tokens(before, "cached"), tokens(after, "cached")
	for k, v := range p1 {
		// A counter that went down (a gateway restarted between the readings) says nothing of the interval.
		if d, dc := v-p0[k], c1[k]-c0[k]; d > 0 && dc >= 0 {
			get(k).HitRate = min(1, dc/d)
		}
	}
	for k, h := range ttftDeltas(before, after) {
		if h.count < 0 {
			continue // reset between the readings
		}
		p := get(k)
		p.TTFTP95 = h.quantile(0.95)
		if interval > 0 {
			p.RequestsPerSecond = h.count / interval.Seconds()
		}
	}
	r := &LiveReport{Interval: interval}
	for _, p := range pools {
		p.Headroom = 1 - p.KVUsage
		if minutes := p.Headroom / p.KVGrowthPerMinute; p.KVGrowthPerMinute > 0 && minutes < maxWallMinutes {
			p.UntilWall = time.Duration(minutes * float64(time.Minute))
			if r.FirstWall == "" || p.UntilWall < r.FirstAfter {
				r.FirstWall, r.FirstAfter = p.Model+"/"+p.Pool, p.UntilWall
			}
		}
		r.Pools = append(r.Pools, *p)
	}
	slices.SortFunc(r.Pools, func(a, b LivePool) int { return strings.Compare(a.Model+"/"+a.Pool, b.Model+"/"+b.Pool) })
	return r
}

// kvReading is a pool's KV usage in one reading: each endpoint's ratio weighted by its capacity (1 when its
// engine exports none), the capacity known, and the endpoints reporting.
type kvReading struct {
	weighted, weight, capacity float64
	endpoints                  int
}

func (r kvReading) usage() float64 { return r.weighted / r.weight }

func readKV(fams map[string]*dto.MetricFamily) map[poolKey]kvReading {
	caps := map[[3]string]float64{} // model, pool, endpoint
	eachPool(fams, "infergate_endpoint_kv_cache_capacity_tokens", "model", func(k poolKey, m *dto.Metric) {
		caps[[3]string{k.model, k.pool, fleet.Label(m, "endpoint")}] = fleet.Value(m)
	})
	out := map[poolKey]kvReading{}
	eachPool(fams, "infergate_endpoint_kv_cache_usage_ratio", "model", func(k poolKey, m *dto.Metric) {
		c := max(caps[[3]string{k.model, k.pool, fleet.Label(m, "endpoint")}], 0)
		r := out[k]
		r.weighted += min(max(fleet.Value(m), 0), 1) * max(c, 1) // a ratio: whatever an engine reports, 0..1
		r.weight += max(c, 1)
		r.capacity += c
		r.endpoints++
		out[k] = r
	})
	return out
}

// histDelta is a TTFT histogram's growth over the interval, summed over a pool's series.
type histDelta struct {
	bounds []float64
	counts []float64 // cumulative, per bound
	count  float64
}

func ttftDeltas(before, after map[string]*dto.MetricFamily) map[poolKey]*histDelta {
	collect := func(fams map[string]*dto.MetricFamily) map[poolKey]*histDelta {
		out := map[poolKey]*histDelta{}
		eachPool(fams, "gen_ai_server_time_to_first_token_seconds", "gen_ai_request_model", func(k poolKey, m *dto.Metric) {
			h := m.GetHistogram()
			if h == nil {
				return
			}
			d := out[k]
			if d == nil {
				d = &histDelta{}
				for _, b := range h.GetBucket() {
					d.bounds = append(d.bounds, b.GetUpperBound())
				}
				d.counts = make([]float64, len(d.bounds))
				out[k] = d
			}
			for i, b := range h.GetBucket() {
				if i < len(d.counts) {
					d.counts[i] += float64(b.GetCumulativeCount())
				}
			}
			d.count += float64(h.GetSampleCount())
		})
		return out
	}
	b, a := collect(before), collect(after)
	for k, d := range a {
		if old := b[k]; old != nil && len(old.counts) == len(d.counts) {
			for i := range d.counts {
				d.counts[i] -= old.counts[i]
			}
			d.count -= old.count
		}
	}
	return a
}

// quantile is the upper bound of the bucket holding the q-th sample (0 without samples).
func (h *histDelta) quantile(q float64) time.Duration {
	if h.count <= 0 {
		return 0
	}
	rank := math.Ceil(q * h.count)
	for i, c := range h.counts {
		if c >= rank {
			if math.IsInf(h.bounds[i], 1) {
				break
			}
			return time.Duration(h.bounds[i] * float64(time.Second))
		}
	}
	if n := len(h.bounds); n > 1 {
		return time.Duration(h.bounds[n-2] * float64(time.Second)) // beyond the last finite bound
	}
	return 0
}

// RenderLive writes the live report as a table.
func RenderLive(w io.Writer, r *LiveReport) {
	fmt.Fprintf(w, "fleet over %s\n", r.Interval)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPOOL\tREPLICAS\tKV TOKENS\tKV USED\tKV GROWTH/MIN\tWAITING\tRUNNING\tREQ/S\tHIT RATE\tTTFT p95\tHEADROOM\tUNTIL WALL\tDESIRED")
	for _, p := range r.Pools {
		until := "-"
		if p.UntilWall > 0 {
			until = p.UntilWall.Round(time.Second).String()
		}
		capTok := "?"
		if p.KVCapacityTokens > 0 {
			capTok = fmt.Sprintf("%.0f", p.KVCapacityTokens)
		}
		desired := "-"
		if p.DesiredReplicas > 0 {
			desired = fmt.Sprintf("%.0f", p.DesiredReplicas)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.1f%%\t%+.2f%%\t%.0f\t%.0f\t%.2f\t%.0f%%\t%s\t%.1f%%\t%s\t%s\n", p.Model, p.Pool, p.Replicas, capTok,
			100*p.KVUsage, 100*p.KVGrowthPerMinute, p.Waiting, p.Running, p.RequestsPerSecond, 100*p.HitRate, ms(p.TTFTP95),
			100*p.Headroom, until, desired)
	}
	_ = tw.Flush()
	if r.FirstWall == "" {
		fmt.Fprintln(w, "no pool's KV cache use is growing: no wall in sight at the current load")
		return
	}
	fmt.Fprintf(w, "first to hit the KV wall: %s, in about %s at the current growth\n", r.FirstWall, r.FirstAfter.Round(time.Second))
}
