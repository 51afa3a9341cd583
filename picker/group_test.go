package picker

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
)

// A cheap class that meets the TTFT target only for cached prompts gets warm groups: with prompts seen to
// share (s = 0.9: nine follow-ups a group) most of their tokens (φ = 0.9), a new group's first request goes to
// the L40S pool though it is late there, because the group's follow-ups meet their target there more cheaply;
// its follow-ups then stay, in time. Within the error budget only, and only when groups have follow-ups.
func TestGroupPlacementWarmsACheapClassThatMeetsOnlyCached(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	system := func(g int) string { return strings.Repeat(fmt.Sprintf("group %d shared context ", g), 500) } // ≈ 3,500 tokens
	picker := func(sharing, budgetSpent float64) *Affinity {
		p := newMixedPicker(idleEngines(nil))
		p.sharing.Store(math.Float64bits(sharing))
		p.shared.Store(math.Float64bits(0.9))
		if budgetSpent > 0 {
			p.pred.noteDecision("m", false, false) // makes the maps
			p.pred.sacrificed["m"] = budgetSpent
		}
		return p
	}
	t.Run("sharing workload: the group goes to the cheap class", func(t *testing.T) {
		p := picker(0.9, 0)
		clock := fakeclock.New()
		p.Now = clock.Now
		d, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, system(1), "first question")})
		if err != nil {
			t.Fatal(err)
		}
		if d.Pool.Name != "cheap" || d.Predicted.inTime {
			t.Fatalf("first request: pool %s, in time %v; want the cheap pool, predicted late; scores %+v", d.Pool.Name, d.Predicted.inTime, d.Scores)
		}
		for _, s := range d.Scores {
			if s.FollowUpTTFT <= 0 || s.GroupCostUSD <= s.CostUSD {
				t.Errorf("%s: follow-up TTFT %v, group cost %v (first %v): want the group figures", s.Endpoint, s.FollowUpTTFT, s.GroupCostUSD, s.CostUSD)
			}
			if cheap := strings.HasPrefix(s.Endpoint, "10.0.1."); cheap && (s.MeetsSLO || s.FollowUpTTFT > 400e6) {
				t.Errorf("%s: meets %v, follow-up %v: want the first late and the follow-ups in time", s.Endpoint, s.MeetsSLO, s.FollowUpTTFT)
			}
		}
		clock.Advance(time.Minute) // the follow-up comes once the first request is answered
		follow, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, system(1), "a follow-up")})
		if err != nil || follow.Endpoints[0] != d.Endpoints[0] || !follow.Predicted.inTime {
			t.Fatalf("follow-up: %v (%v), in time %v; want %s, in time", follow.Endpoints, err, follow.Predicted.inTime, d.Endpoints[0])
		}
	})
	for _, tc := range []struct {
		name                 string
		sharing, budgetSpent float64
	}{
		{"prompts rarely shared: the first request's own cost decides", 0.05, 0},
		{"the error budget spent: the first request is served in time", 0.9, 0.01},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := picker(tc.sharing, tc.budgetSpent).Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, system(2), "q")})
			if err != nil || d.Pool.Name != "fast" || !d.Predicted.inTime {
				t.Fatalf("got %v (%v), in time %v; want the fast pool, in time", d.Pool, err, d.Predicted.inTime)
			}
		})
	}
}

// A first request is sacrificed only where it is late for the class's speed, not for its queue: a cheap class
// that would serve an uncached prompt in time when idle, and is late only for the requests waiting ahead of it,
// does not take the new group late — its lateness is load that the next requests meet too.
func TestGroupPlacementSacrificesOnlyForTheClassesSpeed(t *testing.T) {
	snap, m := modelOf(t, sloPolicy(policies.PlacementSLO, policies.WhenSaturated))
	p := newMixedPicker(idleEngines(func(ep string, em *fleet.EngineMetrics) {
		if strings.HasPrefix(ep, "10.0.1.") {
			em.Waiting = 2
		}
	}))
	p.sharing.Store(math.Float64bits(0.9))
	p.shared.Store(math.Float64bits(0.9))
	system := strings.Repeat("group 3 shared context ", 200) // ≈ 1,150 tokens: ≈ 190 ms on an idle L40S, in time
	d, err := p.Pick(snap, Input{Tenant: proTenant(snap), Model: m, Request: request(t, system, "q")})
	if err != nil || d.Pool.Name != "fast" || !d.Predicted.inTime {
		t.Fatalf("got %v (%v), in time %v; want the fast pool, in time; scores %+v", d.Pool, err, d.Predicted.inTime, d.Scores)
	}
	for _, s := range d.Scores {
		if strings.HasPrefix(s.Endpoint, "10.0.1.") && (s.MeetsSLO || s.FollowUpTTFT > 400e6) {
			t.Errorf("%s: meets %v, follow-up %v: want the first late for its queue, the follow-ups in time", s.Endpoint, s.MeetsSLO, s.FollowUpTTFT)
		}
	}
}
