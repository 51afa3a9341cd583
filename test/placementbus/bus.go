// Package placementbus carries placements between a benchmark's gateway replicas as Redis pub/sub carries them
// between real ones (the placements package): a delay after they were published, to every replica but the
// sender.
package placementbus

import (
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/picker"
)

// Bus is one set of replicas' channel.
type Bus struct {
	// After runs f d from now: time.AfterFunc's in real time, or a simulator's in its own.
	After func(d time.Duration, f func())
	Delay time.Duration
	// Published, when set, counts the messages put on the bus (placements and churn reports).
	Published *atomic.Int64
	members   []*picker.Affinity
}

// Join adds a replica and returns its end of the bus.
func (b *Bus) Join(a *picker.Affinity) picker.Placements {
	b.members = append(b.members, a)
	return end{b: b, from: a}
}

// end is one replica's end of the bus: what it publishes reaches every member but itself.
type end struct {
	b    *Bus
	from *picker.Affinity
}

// Publish delivers pl to the other replicas.
func (e end) Publish(pl picker.Placement) {
	e.send(func(m *picker.Affinity) { m.Learn(pl) })
}

// PublishChurn sends a whole churn report as one message, as the placements package does.
func (e end) PublishChurn(blocks map[string]int) {
	e.send(func(m *picker.Affinity) {
		for ep, n := range blocks {
			m.Learn(picker.Placement{Endpoint: ep, Churn: n})
		}
	})
}

func (e end) send(learn func(*picker.Affinity)) {
	if e.b.Published != nil {
		e.b.Published.Add(1)
	}
	e.b.After(e.b.Delay, func() {
		for _, m := range e.b.members {
			if m != e.from {
				learn(m)
			}
		}
	})
}
