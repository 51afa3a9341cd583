// Package relay makes the engines' readings cost one scrape per engine per interval, however many gateway
// replicas there are: the replica holding a lease in Redis scrapes and publishes each round over Redis
// pub/sub, the others take its readings instead of scraping, and scrape themselves again whenever the relay
// falls two intervals behind (a lost leader, a Redis outage), so a reading is never staler than without it.
package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/infergate/infergate/fleet"
)

// Channel is the pub/sub channel rounds of readings travel on; LeaseKey names the replica that scrapes.
const (
	Channel  = "infergate:fleet:v1"
	LeaseKey = "infergate:fleet:scraper"
)

// ChannelFor and LeaseKeyFor are the channel and lease of one region's replicas (Channel and LeaseKey when
// region is "").
func ChannelFor(region string) string { return scoped(Channel, region) }

// LeaseKeyFor: see ChannelFor.
func LeaseKeyFor(region string) string { return scoped(LeaseKey, region) }

func scoped(name, region string) string {
	if region == "" {
		return name
	}
	return name + ":" + region
}

// Bounds on a message, checked before anything else is believed: a round of up to MaxReadings engines.
const (
	MaxMessageBytes = 8 << 20
	MaxReadings     = 20000
	maxAddrBytes    = 256
	maxLoRAs        = 256
	maxNameBytes    = 256
	maxAge          = time.Minute
)

// ErrMalformed is any message that is not a round this version can read.
var ErrMalformed = errors.New("malformed fleet relay message")

type message struct {
	Origin   string    `json:"origin"`
	Readings []reading `json:"readings"`
}

type reading struct {
	Addr      string   `json:"addr"`
	Running   float64  `json:"running"`
	Waiting   float64  `json:"waiting"`
	KVUtil    float64  `json:"kvUtil"`
	BlockSize int      `json:"blockSize,omitempty"`
	NumBlocks int      `json:"numBlocks,omitempty"`
	LoRAs     []string `json:"loras,omitempty"`
	Version   string   `json:"version,omitempty"`
	Failed    bool     `json:"failed,omitempty"`
	// The engine's prompt-token counters (fleet.EngineMetrics): bounded as totals, not checked against each other.
	PromptTokens       float64 `json:"promptTokens,omitempty"`
	CachedPromptTokens float64 `json:"cachedPromptTokens,omitempty"`
	// AgeMS is how old the reading was when it was published: the receiver dates it by its own clock, so
	// that clocks that disagree between hosts cannot make a reading look fresher than it is.
	AgeMS float64 `json:"ageMs"`
}

// encode writes a round of readings, dated relative to now.
func encode(origin string, rs []fleet.Reading, now time.Time) ([]byte, error) {
	m := message{Origin: origin, Readings: make([]reading, 0, min(len(rs), MaxReadings))}
	for _, r := range rs[:min(len(rs), MaxReadings)] {
		e := r.Metrics
		m.Readings = append(m.Readings, reading{Addr: r.Addr, Running: e.Running, Waiting: e.Waiting, KVUtil: e.KVUtil,
			BlockSize: e.BlockSize, NumBlocks: e.NumBlocks, LoRAs: e.LoRAs, Version: e.Version, Failed: r.Failed,
			PromptTokens: e.PromptTokens, CachedPromptTokens: e.CachedPromptTokens, AgeMS: age(now, e.At, r.Failed)})
	}
	return json.Marshal(m)
}

// decode reads a round, dating each reading by now less its age.
func decode(b []byte, now time.Time) (string, []fleet.Reading, error) {
	if len(b) > MaxMessageBytes {
		return "", nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	var m message
	if err := json.Unmarshal(b, &m); err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if m.Origin == "" || len(m.Origin) > maxNameBytes || len(m.Readings) > MaxReadings {
		return "", nil, fmt.Errorf("%w: origin or reading count", ErrMalformed)
	}
	out := make([]fleet.Reading, 0, len(m.Readings))
	for i, r := range m.Readings {
		if err := r.check(); err != nil {
			return "", nil, fmt.Errorf("%w: reading %d: %v", ErrMalformed, i, err)
		}
		if r.Failed {
			out = append(out, fleet.Reading{Addr: r.Addr, Failed: true})
			continue
		}
		out = append(out, fleet.Reading{Addr: r.Addr, Metrics: fleet.EngineMetrics{Running: r.Running, Waiting: r.Waiting,
			KVUtil: r.KVUtil, BlockSize: r.BlockSize, NumBlocks: r.NumBlocks, LoRAs: r.LoRAs, Version: r.Version,
			PromptTokens: r.PromptTokens, CachedPromptTokens: r.CachedPromptTokens,
			At: now.Add(-time.Duration(r.AgeMS * float64(time.Millisecond)))}})
	}
	return m.Origin, out, nil
}

// check bounds every field of a reading from another process.
func (r *reading) check() error {
	switch {
	case r.Addr == "" || len(r.Addr) > maxAddrBytes:
		return errors.New("address")
	case !count(r.Running) || !count(r.Waiting):
		return errors.New("running or waiting")
	case !tokenCount(r.PromptTokens) || !tokenCount(r.CachedPromptTokens):
		return errors.New("prompt-token counters")
	case !(r.KVUtil >= 0 && r.KVUtil <= 1):
		return errors.New("KV utilisation outside 0..1")
	case r.BlockSize < 0 || r.BlockSize > 1<<20 || r.NumBlocks < 0 || r.NumBlocks > 1<<31-1:
		return errors.New("KV blocks")
	case len(r.LoRAs) > maxLoRAs || len(r.Version) > maxNameBytes:
		return errors.New("adapters or version")
	case !(r.AgeMS >= 0 && r.AgeMS <= float64(maxAge/time.Millisecond)):
		return errors.New("age")
	}
	for _, l := range r.LoRAs {
		if len(l) > maxNameBytes {
			return errors.New("adapter name")
		}
	}
	return nil
}

// count is a finite non-negative number of requests.
func count(v float64) bool { return v >= 0 && v <= 1e9 && !math.IsInf(v, 0) }

// tokenCount says whether an engine's token counter is one: a count since the engine started, within
// fleet.MaxTokenCount.
func tokenCount(v float64) bool { return v >= 0 && v <= fleet.MaxTokenCount }

// age is a reading's age in milliseconds when published (0 for a failed one, which has no time).
func age(now, at time.Time, failed bool) float64 {
	if failed {
		return 0
	}
	return float64(min(maxAge, max(0, now.Sub(at)))) / float64(time.Millisecond)
}
