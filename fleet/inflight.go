// Package fleet is the gateway's view of its replicas. This file holds what the gateway knows without asking
// anyone: how many requests it has sent to each endpoint that have not finished yet.
package fleet

import (
	"sync"
	"sync/atomic"
)

// InFlight counts this process's unfinished requests per endpoint. It is safe for concurrent use, and reads
// on the request path take no lock once an endpoint has been seen.
type InFlight struct {
	counters sync.Map // endpoint string -> *atomic.Int64
	total    atomic.Int64
}

func (f *InFlight) counter(endpoint string) *atomic.Int64 {
	if c, ok := f.counters.Load(endpoint); ok {
		return c.(*atomic.Int64)
	}
	c, _ := f.counters.LoadOrStore(endpoint, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// Start records a request sent to endpoint.
func (f *InFlight) Start(endpoint string) {
	f.counter(endpoint).Add(1)
	f.total.Add(1)
}

// Done records that a request to endpoint finished, however it ended.
func (f *InFlight) Done(endpoint string) {
	f.counter(endpoint).Add(-1)
	f.total.Add(-1)
}

// Count returns the unfinished requests at endpoint.
func (f *InFlight) Count(endpoint string) int64 {
	if c, ok := f.counters.Load(endpoint); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// Total returns the unfinished requests across all endpoints.
func (f *InFlight) Total() int64 { return f.total.Load() }
