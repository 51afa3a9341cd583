package regionnet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Record is one request of the traffic: where it was sent, as whom, when, and what it got.
type Record struct {
	Region, Tenant string
	At             time.Time
	Answer
}

// Traffic sends requests to every region's data plane at a steady rate, as each tenant in turn, until stopped.
type Traffic struct {
	mu      sync.Mutex
	records []Record
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// StartTraffic sends, to each region, one request every interval, cycling through tenants (a tenant
// "pinned-home" stands for the region's own pinned tenant).
func (c *Cluster) StartTraffic(ctx context.Context, interval time.Duration, tenants ...string) *Traffic {
	ctx, cancel := context.WithCancel(ctx)
	t := &Traffic{stop: cancel}
	for _, region := range c.Regions {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			var inflight sync.WaitGroup
			defer inflight.Wait()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				tenant := tenants[n%len(tenants)]
				if tenant == "pinned-home" {
					tenant = "pinned-" + region
				}
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					at := time.Now()
					a := c.Ask(context.WithoutCancel(ctx), region, tenant, fmt.Sprintf("request %d from %s", n, region))
					t.mu.Lock()
					t.records = append(t.records, Record{Region: region, Tenant: tenant, At: at, Answer: a})
					t.mu.Unlock()
				}()
			}
		}()
	}
	return t
}

// Stop ends the traffic and returns every record, in the order the answers came.
func (t *Traffic) Stop() []Record {
	t.stop()
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.records
}

// Resident says whether a record's answer respected its tenant's residency: a pinned tenant served only by
// its region's pools or managed API (or refused).
func (r Record) Resident() bool {
	home, pinned := strings.CutPrefix(r.Tenant, "pinned-")
	return !pinned || r.Served == "" || r.Served == home || r.Served == "managed-"+home
}
