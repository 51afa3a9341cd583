// Package fleet is the gateway's view of its replicas. This file holds what the gateway knows without asking
// anyone: how many requests it has sent to each endpoint that have not finished yet, and in what order.
package fleet

import (
	"sync"
	"sync/atomic"
	"time"
)

// InFlight counts this process's unfinished requests per endpoint. It is safe for concurrent use, and reads
// on the request path take no lock once an endpoint has been seen.
type InFlight struct {
	endpoints sync.Map // endpoint string -> *endpointLoad
	total     atomic.Int64
	starts    atomic.Uint64
}

type endpointLoad struct {
	count     atomic.Int64
	held      sync.Map // tier string -> *atomic.Int64: requests of tiers with a reserve (Hold)
	lastStart atomic.Uint64
	// readingAt and atReading: the engine reading SinceReading last saw, and the count when it saw it.
	readingMu sync.Mutex
	readingAt int64
	atReading int64
}

func (f *InFlight) endpoint(endpoint string) *endpointLoad {
	if c, ok := f.endpoints.Load(endpoint); ok {
		return c.(*endpointLoad)
	}
	c, _ := f.endpoints.LoadOrStore(endpoint, new(endpointLoad))
	return c.(*endpointLoad)
}

// Start records a request sent to endpoint.
func (f *InFlight) Start(endpoint string) {
	e := f.endpoint(endpoint)
	e.count.Add(1)
	e.lastStart.Store(f.starts.Add(1))
	f.total.Add(1)
}

// Done records that a request to endpoint finished, however it ended.
func (f *InFlight) Done(endpoint string) {
	f.endpoint(endpoint).count.Add(-1)
	f.total.Add(-1)
}

// Count returns the unfinished requests at endpoint.
func (f *InFlight) Count(endpoint string) int64 {
	if c, ok := f.endpoints.Load(endpoint); ok {
		return c.(*endpointLoad).count.Load()
	}
	return 0
}

// Hold counts one more unfinished request of a tier with a reserve (spec.tiers.*.reserve) at endpoint, beside
// Start: lower tiers leave free what the tier's requests there do not fill. Release undoes it.
func (f *InFlight) Hold(endpoint, tier string) { f.held(endpoint, tier).Add(1) }

// Release records that a request Hold counted finished.
func (f *InFlight) Release(endpoint, tier string) { f.held(endpoint, tier).Add(-1) }

// Held is how many of tier's requests Hold counts at endpoint.
func (f *InFlight) Held(endpoint, tier string) int64 {
	if c, ok := f.endpoints.Load(endpoint); ok {
		if n, ok := c.(*endpointLoad).held.Load(tier); ok {
			return n.(*atomic.Int64).Load()
		}
	}
	return 0
}

func (f *InFlight) held(endpoint, tier string) *atomic.Int64 {
	e := f.endpoint(endpoint)
	if n, ok := e.held.Load(tier); ok {
		return n.(*atomic.Int64)
	}
	n, _ := e.held.LoadOrStore(tier, new(atomic.Int64))
	return n.(*atomic.Int64)
}

// LastStarted orders endpoints by when this process last sent them a request (0: never). Among equally loaded
// endpoints, the one served longest ago has had the most time to work through its queue.
func (f *InFlight) LastStarted(endpoint string) uint64 {
	if c, ok := f.endpoints.Load(endpoint); ok {
		return c.(*endpointLoad).lastStart.Load()
	}
	return 0
}

// SinceReading is how many more of this process's requests are unfinished at endpoint than when the engine
// reading taken at at was first looked at: what the engine's queue has gained since, as far as this process
// knows. A new reading starts the count again from zero.
func (f *InFlight) SinceReading(endpoint string, at time.Time) int64 {
	e := f.endpoint(endpoint)
	stamp := at.UnixNano()
	e.readingMu.Lock()
	defer e.readingMu.Unlock()
	now := e.count.Load()
	if e.readingAt != stamp {
		e.readingAt, e.atReading = stamp, now
		return 0
	}
	return now - e.atReading
}

// Total returns the unfinished requests across all endpoints.
func (f *InFlight) Total() int64 { return f.total.Load() }
