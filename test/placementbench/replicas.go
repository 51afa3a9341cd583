package main

import (
	"time"

	"github.com/infergate/infergate/picker"
)

// shareDelay is how long a placement takes to reach the other gateway replicas (Redis pub/sub), in the sim's
// time.
const shareDelay = 5 * time.Millisecond

// placementBus carries gateway replicas' placements to each other in the sim's time, as infergate serve's
// replicas publish them over Redis with --share-placements (the default with Redis).
type placementBus struct {
	sim     *sim
	members []*picker.Affinity
}

// join adds a replica and returns its end of the bus.
func (b *placementBus) join(a *picker.Affinity) picker.Placements {
	b.members = append(b.members, a)
	return busEnd{b: b, from: a}
}

// busEnd is one replica's end of the bus: what it publishes reaches every member but itself.
type busEnd struct {
	b    *placementBus
	from *picker.Affinity
}

// Publish delivers pl to every other replica shareDelay later.
func (e busEnd) Publish(pl picker.Placement) {
	e.b.sim.after(shareDelay, func() {
		for _, m := range e.b.members {
			if m != e.from {
				m.Learn(pl)
			}
		}
	})
}

// PublishChurn sends a churn report to every other replica, as the placements package does in one message.
func (e busEnd) PublishChurn(blocks map[string]int) {
	e.b.sim.after(shareDelay, func() {
		for _, m := range e.b.members {
			if m != e.from {
				for ep, n := range blocks {
					m.Learn(picker.Placement{Endpoint: ep, Churn: n})
				}
			}
		}
	})
}
