package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// EngineMetrics is what routing needs from an engine's /metrics.
type EngineMetrics struct {
	Running   float64
	Waiting   float64
	KVUtil    float64 // 0..1
	BlockSize int     // tokens per KV block; 0 when not exported
	NumBlocks int     // KV capacity in blocks; 0 when not exported
	LoRAs     []string
	// Version is the engine version the metrics report (the version label of <dialect>:build_info), "" when
	// the engine exports none; a rollout's compatibility gate compares it.
	Version string
	// PromptTokens and CachedPromptTokens are the engine's counters, since it started, of the prompt tokens of
	// its requests and of those its prefix cache (or a KV connector) already held (0 when not exported). The
	// growth of the first less the second's between readings is the prefill it computed, every gateway
	// replica's requests counted, where one replica sees only its own; engines count the two at different
	// moments of a request, so a consumer floors that difference at 0.
	PromptTokens, CachedPromptTokens float64
	At                               time.Time
}

// ParseFamilies reads a Prometheus text exposition with prometheus/common.
func ParseFamilies(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// Parse reads a Prometheus text exposition and applies a dialect.
func Parse(r io.Reader, d Dialect) (EngineMetrics, error) {
	fams, err := ParseFamilies(r)
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("parse %s metrics: %w", d.Name(), err)
	}
	return d.Read(fams), nil
}

// Target is one endpoint to scrape.
type Target struct {
	Addr    string // ip:port of the engine (its /metrics is served there)
	Dialect Dialect
}

// Scraper polls engines' /metrics and keeps the latest reading of each. A reading older than StaleAfter
// counts as missing: routing treats such an endpoint as saturated rather than trusting old numbers.
type Scraper struct {
	Interval   time.Duration
	StaleAfter time.Duration
	// Now replaces the clock that stamps readings and judges their age (tests).
	Now    func() time.Time
	Client *http.Client
	// OnRound, when set, is called after every round of scrapes, and after every round of relayed readings
	// (the admission queue looks for room again).
	OnRound func()
	// Relay, when set, shares rounds of readings with the other gateway replicas: a round it says to skip is
	// not scraped (another replica's readings arrive through AcceptRound), and every round scraped is handed
	// to it.
	Relay Relay

	mu        sync.RWMutex
	targets   []Target
	targetSet map[string]bool
	latest    map[string]EngineMetrics
	scraping  map[string]bool // targets whose scrape has not finished (a far one outlasts its round)

	firstMu   sync.Mutex
	firstCh   chan struct{}
	firstOnce sync.Once
}

// Relay shares the engines' readings between gateway replicas, so that the engines are scraped once per
// interval, not once per replica (the relay package).
type Relay interface {
	// Skip reports whether this round's scrapes are unnecessary: another replica's readings are arriving.
	Skip() bool
	// Publish hears the readings of a round this replica scraped; it must not block.
	Publish([]Reading)
}

// Reading is one engine's metrics, as a relay carries them; Failed marks an engine the round tried and could
// not read (its Metrics are empty).
type Reading struct {
	Addr    string
	Metrics EngineMetrics
	Failed  bool
}

// AcceptRound stores a round of readings another replica scraped, keeping only this scraper's targets and,
// for each, the newer reading; then it ends the first round and calls OnRound, as a round of its own does.
// It reports whether the round covered every target (read or failed): a replica whose policy lists an engine
// the round did not try must scrape for itself.
func (s *Scraper) AcceptRound(readings []Reading) (complete bool) {
	s.mu.Lock()
	if s.latest == nil {
		s.latest = map[string]EngineMetrics{}
	}
	covered := 0
	for _, r := range readings {
		if !s.targetSet[r.Addr] {
			continue
		}
		covered++
		if r.Failed {
			continue
		}
		if held, ok := s.latest[r.Addr]; !ok || r.Metrics.At.After(held.At) {
			s.latest[r.Addr] = r.Metrics
		}
	}
	complete = covered >= len(s.targetSet)
	s.mu.Unlock()
	s.firstOnce.Do(func() { close(s.first()) })
	if s.OnRound != nil {
		s.OnRound()
	}
	return complete
}

// SetTargets replaces the endpoints to scrape (on policy reload).
func (s *Scraper) SetTargets(ts []Target) {
	s.mu.Lock()
	s.targets = ts
	s.targetSet = make(map[string]bool, len(ts))
	for _, t := range ts {
		s.targetSet[t.Addr] = true
	}
	if s.latest == nil {
		s.latest = map[string]EngineMetrics{}
	}
	s.mu.Unlock()
}

// Metrics returns an endpoint's latest reading and whether it is fresh.
func (s *Scraper) Metrics(addr string) (EngineMetrics, bool) {
	s.mu.RLock()
	m, ok := s.latest[addr]
	s.mu.RUnlock()
	if !ok {
		return EngineMetrics{}, false
	}
	return m, s.now().Sub(m.At) <= s.staleAfter()
}

func (s *Scraper) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Scraper) staleAfter() time.Duration {
	if s.StaleAfter > 0 {
		return s.StaleAfter
	}
	return 5 * s.interval()
}

func (s *Scraper) interval() time.Duration {
	if s.Interval > 0 {
		return s.Interval
	}
	return 100 * time.Millisecond
}

// Run scrapes every target each interval until ctx ends; targets are scraped concurrently.
func (s *Scraper) Run(ctx context.Context) {
	client := s.Client
	if client == nil {
		client = &http.Client{Timeout: s.scrapeTimeout()}
	}
	t := time.NewTicker(s.interval())
	defer t.Stop()
	for {
		if s.Relay == nil || !s.Relay.Skip() {
			s.round(ctx, client)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeTimeout bounds one scrape: up to the age at which a reading goes stale, less an interval, so that an
// engine in another region, a round trip of 100 ms or more away, is still read in time.
func (s *Scraper) scrapeTimeout() time.Duration {
	return max(s.interval(), s.staleAfter()-s.interval())
}

// round scrapes every target, concurrently, and hands the readings to the relay. It waits at most one interval:
// a scrape still going then (an engine far away) finishes on its own, its reading stored when it comes, and the
// target is not scraped again until it has; the relay then gets the target's last reading instead.
func (s *Scraper) round(ctx context.Context, client *http.Client) {
	s.mu.Lock()
	targets := s.targets
	if s.scraping == nil {
		s.scraping = map[string]bool{}
	}
	var started []Target
	for _, tg := range targets {
		if !s.scraping[tg.Addr] {
			s.scraping[tg.Addr] = true
			started = append(started, tg)
		}
	}
	s.mu.Unlock()
	results := make(chan Reading, len(started)) // a straggler's send never blocks
	for _, tg := range started {
		go func() {
			m, err := s.scrape(ctx, client, tg)
			s.mu.Lock()
			if err == nil {
				s.latest[tg.Addr] = m
			}
			delete(s.scraping, tg.Addr)
			s.mu.Unlock()
			results <- Reading{Addr: tg.Addr, Metrics: m, Failed: err != nil}
		}()
	}
	readings := s.gather(ctx, results, len(started))
	s.firstOnce.Do(func() { close(s.first()) })
	if s.Relay != nil && len(targets) > 0 {
		s.Relay.Publish(s.withHeld(readings, targets))
	}
	if s.OnRound != nil {
		s.OnRound()
	}
}

// gather takes the round's readings as they come, for at most one interval.
func (s *Scraper) gather(ctx context.Context, results <-chan Reading, n int) []Reading {
	readings := make([]Reading, 0, n)
	timer := time.NewTimer(s.interval())
	defer timer.Stop()
	for len(readings) < n {
		select {
		case r := <-results:
			readings = append(readings, r)
		case <-timer.C:
			return readings
		case <-ctx.Done():
			return readings
		}
	}
	return readings
}

// withHeld completes a round's readings with the last reading of every target the round has none of (a scrape
// still going), so that the replicas taking the round find every target in it: such a target counts as failed
// until it has been read once.
func (s *Scraper) withHeld(readings []Reading, targets []Target) []Reading {
	got := make(map[string]bool, len(readings))
	for _, r := range readings {
		got[r.Addr] = true
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, tg := range targets {
		if got[tg.Addr] {
			continue
		}
		m, ok := s.latest[tg.Addr]
		readings = append(readings, Reading{Addr: tg.Addr, Metrics: m, Failed: !ok})
	}
	return readings
}

// FirstRound is closed once Run has scraped every target once (successfully or not): a gateway that waits for
// it does not route its first requests on no data at all.
func (s *Scraper) FirstRound() <-chan struct{} { return s.first() }

func (s *Scraper) first() chan struct{} {
	s.firstMu.Lock()
	defer s.firstMu.Unlock()
	if s.firstCh == nil {
		s.firstCh = make(chan struct{})
	}
	return s.firstCh
}

func (s *Scraper) scrape(ctx context.Context, client *http.Client, tg Target) (EngineMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tg.Addr+"/metrics", nil)
	if err != nil {
		return EngineMetrics{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return EngineMetrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return EngineMetrics{}, fmt.Errorf("metrics of %s: status %d", tg.Addr, resp.StatusCode)
	}
	m, err := Parse(resp.Body, tg.Dialect)
	if err != nil {
		return EngineMetrics{}, err
	}
	m.At = s.now()
	return m, nil
}
