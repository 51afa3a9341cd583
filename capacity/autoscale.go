package capacity

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/latency"
	"github.com/infergate/infergate/policies"
)

// Scaling rules, as platform teams run inference pools: out when the engines' queues pass twice their batch or
// the TTFT p95 passes 80 % of its target; in one replica at a time after calmFor of short queues, TTFT under
// half its target and KV use under half; never below the warm pool.
const (
	queueFactor    = 2
	ttftOutShare   = 0.8
	ttftInShare    = 0.5
	kvInShare      = 0.5
	calmFor        = 5 * time.Minute
	ttftWindow     = time.Minute
	maxScaleFactor = 2 // at most double a pool in one decision
)

// EngineView is the scraper's latest reading of each engine (fleet.Scraper).
type EngineView interface {
	Metrics(addr string) (fleet.EngineMetrics, bool)
}

// Autoscaler turns each pool's load into a desired replica count, exported as infergate_pool_desired_replicas
// for KEDA or an HPA on an external metric. It hears every settlement (for each pool's TTFT p95) and reads
// the engines at scrape time; the request path pays one histogram increment.
type Autoscaler struct {
	Policies *policies.Store
	Engines  EngineView // nil: queues and KV use unknown, TTFT alone decides
	Now      func() time.Time

	ttft sync.Map // poolKey → *ttftRing: settlements of different pools do not contend

	mu   sync.Mutex
	calm map[poolKey]time.Time // since when the pool has been calm
	// in remembers a scale-in decided at a pool's replica count: the figure stays one below that count until
	// the count changes or the calm breaks, so every scraper and the HPA's stabilisation see it.
	in map[poolKey]int
}

// Decision is one pool's autoscaling figure and why.
type Decision struct {
	Current, Desired int
	Reason           string
	TTFTP95          time.Duration
	Waiting, Batch   float64 // per replica
	KVUsage          float64
}

// NewAutoscaler builds an Autoscaler over a policy store.
func NewAutoscaler(p *policies.Store, engines EngineView, now func() time.Time) *Autoscaler {
	if now == nil {
		now = time.Now
	}
	return &Autoscaler{Policies: p, Engines: engines, Now: now, calm: map[poolKey]time.Time{}, in: map[poolKey]int{}}
}

// Settled implements director.SettleObserver: the TTFT of every successful request seen chunk by chunk counts
// for its pool, time queued in the gateway included (under admission the engines' queues stay short and the
// wait moves to the gateway).
func (a *Autoscaler) Settled(st director.Settlement) {
	if !st.Routed || st.Outcome != director.OutcomeOK || !st.Timing.Chunked || st.Timing.TTFT <= 0 || st.HardwareClass == director.ManagedClass {
		return
	}
	k := poolKey{st.Model, st.Pool}
	r, ok := a.ttft.Load(k)
	if !ok {
		r, _ = a.ttft.LoadOrStore(k, &ttftRing{})
	}
	r.(*ttftRing).add(a.Now().Unix(), st.Timing.TTFT) // as the client saw it: a wait in the admission queue counts
}

// Decide computes a pool's desired replicas now.
func (a *Autoscaler) Decide(snap *policies.Snapshot, m *policies.Model, p *policies.Pool) Decision {
	now := a.Now()
	k := poolKey{m.Name, p.Name}
	d := Decision{Current: len(p.Endpoints), Batch: float64(p.MaxConcurrency)}
	var waiting, running, kv float64
	fresh := 0
	for _, ep := range p.Endpoints {
		if a.Engines == nil {
			break
		}
		if em, ok := a.Engines.Metrics(ep); ok {
			fresh++
			waiting, running, kv = waiting+em.Waiting, running+em.Running, kv+em.KVUtil
		}
	}
	if fresh > 0 {
		d.Waiting, d.KVUsage = waiting/float64(fresh), kv/float64(fresh)
		if d.Batch == 0 {
			d.Batch = math.Max(1, running/float64(fresh))
		}
	}
	target := ttftTarget(snap, m)
	if r, ok := a.ttft.Load(k); ok {
		d.TTFTP95 = r.(*ttftRing).p95(now.Unix())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := 1.0
	switch {
	case d.Batch > 0 && d.Waiting > queueFactor*d.Batch:
		out, d.Reason = d.Waiting/(queueFactor*d.Batch), "queue above twice the batch"
	case target > 0 && d.TTFTP95 > time.Duration(ttftOutShare*float64(target)):
		out, d.Reason = float64(d.TTFTP95)/(ttftOutShare*float64(target)), "TTFT p95 above 80% of its target"
	}
	d.Desired = d.Current
	calm := d.Waiting < 1 && (target == 0 || d.TTFTP95 < time.Duration(ttftInShare*float64(target))) && d.KVUsage < kvInShare
	switch {
	case d.Reason != "":
		d.Desired = min(max(d.Current+1, int(math.Ceil(float64(d.Current)*out))), maxScaleFactor*max(d.Current, 1))
		delete(a.calm, k)
		delete(a.in, k)
	case !calm:
		delete(a.calm, k)
		delete(a.in, k)
	case a.in[k] != 0 && a.in[k] == d.Current:
		d.Desired, d.Reason = d.Current-1, "calm for 5m: one replica fewer"
	default:
		if a.in[k] != 0 { // the count moved: the scale-in happened, and the next one waits its own calm period
			delete(a.in, k)
			a.calm[k] = now
		}
		since, ok := a.calm[k]
		if !ok {
			a.calm[k], since = now, now
		}
		if now.Sub(since) >= calmFor {
			d.Desired, d.Reason = d.Current-1, "calm for 5m: one replica fewer"
			a.in[k] = d.Current
		}
	}
	if d.Desired < MinWarmPool {
		d.Desired = MinWarmPool
		if d.Reason == "" || d.Current < MinWarmPool {
			d.Reason = "the warm pool minimum"
		}
	}
	return d
}

// ttftTarget is the strictest TTFT target any tier has for the model (0: none).
func ttftTarget(snap *policies.Snapshot, m *policies.Model) time.Duration {
	var t time.Duration
	for _, e := range snap.SLOTable() {
		if e.Model == m && e.Targets.TTFT > 0 && (t == 0 || e.Targets.TTFT < t) {
			t = e.Targets.TTFT
		}
	}
	return t
}

var (
	autoscaleLabels = []string{"model", "pool", "hardware_class"}
	replicasDesc    = prometheus.NewDesc("infergate_pool_replicas", "Replicas the policy lists for the pool.", autoscaleLabels, nil)
	desiredDesc     = prometheus.NewDesc("infergate_pool_desired_replicas",
		"Replicas the pool should have: more when engine queues pass twice the batch or TTFT p95 passes 80% of target, one fewer after 5 calm minutes, never below 2. KEDA or an HPA on this external metric scales the pool's engines.",
		autoscaleLabels, nil)
)

// Describe implements prometheus.Collector.
func (a *Autoscaler) Describe(ch chan<- *prometheus.Desc) { ch <- replicasDesc; ch <- desiredDesc }

// Collect implements prometheus.Collector: every pool's decision, computed at scrape time.
func (a *Autoscaler) Collect(ch chan<- prometheus.Metric) {
	snap := a.Policies.Current()
	for i := range snap.Policy.Spec.Models {
		m := &snap.Policy.Spec.Models[i]
		for j := range m.Pools {
			p := &m.Pools[j]
			d := a.Decide(snap, m, p)
			ch <- prometheus.MustNewConstMetric(replicasDesc, prometheus.GaugeValue, float64(d.Current), m.Name, p.Name, p.HardwareClass)
			ch <- prometheus.MustNewConstMetric(desiredDesc, prometheus.GaugeValue, float64(d.Desired), m.Name, p.Name, p.HardwareClass)
		}
	}
}

// ttftRing keeps a minute of TTFTs, a histogram per second, for a p95.
type ttftRing struct {
	mu   sync.Mutex
	secs [60]struct {
		at int64
		h  latency.Histogram
	}
}

func (r *ttftRing) add(now int64, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.secs[now%int64(len(r.secs))]
	if s.at != now {
		s.at, s.h = now, latency.Histogram{}
	}
	s.h.Add(d)
}

func (r *ttftRing) p95(now int64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum latency.Histogram
	for i := range r.secs {
		if s := &r.secs[i]; s.at > now-int64(ttftWindow/time.Second) && s.at <= now {
			sum.Merge(&s.h)
		}
	}
	return sum.Quantile(0.95)
}
