package picker

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
)

func TestIndexCountsGroups(t *testing.T) {
	x := NewIndex()
	steps := []struct {
		name string
		do   func()
		want int
	}{
		{"a prompt's fourth block names its group", func() { x.Credit("e", []uint64{1, 2, 3, 4, 5}, 8) }, 1},
		{"another prompt of the same group", func() { x.Credit("e", []uint64{1, 2, 3, 4, 6}, 8) }, 1},
		{"a one-block prompt is its own group", func() { x.Credit("e", []uint64{9}, 8) }, 2},
		{"forgetting the group block", func() { x.Forget("e", 4) }, 1},
		{"forgetting a block that names no group", func() { x.Forget("e", 5) }, 1},
		{"eviction drops groups", func() { x.Credit("e", []uint64{20, 21, 22, 23, 24, 25, 26, 27}, 8) }, 1},
		{"resizing keeps them (and counts the new one)", func() { x.Credit("e", []uint64{30}, 16) }, 2},
		{"re-crediting a held group", func() { x.Credit("e", []uint64{20, 21, 22, 23, 24}, 16) }, 2},
	}
	for _, s := range steps {
		s.do()
		if got := x.Groups("e"); got != s.want {
			t.Fatalf("%s: %d groups, want %d", s.name, got, s.want)
		}
	}
	if x.Capacity("e") != 16 || x.Groups("unknown") != 0 {
		t.Errorf("capacity %d, unknown endpoint's groups %d", x.Capacity("e"), x.Groups("unknown"))
	}
}

func TestNewPrefixPlacement(t *testing.T) {
	snap, m := affinitySnap(t)
	prompt := request(t, strings.Repeat("A brand new group's system prompt. ", 20), "q")
	newPicker := func(sharing float64, inflight *fleet.InFlight) *Affinity {
		p := &Affinity{InFlight: inflight, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
		p.sharing.Store(math.Float64bits(sharing))
		return p
	}
	pick := func(t *testing.T, p *Affinity) string {
		t.Helper()
		d, err := p.Pick(snap, Input{Model: m, Request: prompt})
		if err != nil {
			t.Fatal(err)
		}
		return d.Endpoints[0]
	}
	// home is where the prompt's group starts on an idle fleet with nothing placed: its rendezvous winner.
	home := pick(t, newPicker(0.9, &fleet.InFlight{}))
	others := func() []string {
		var out []string
		for _, pool := range m.Pools {
			for _, ep := range pool.Endpoints {
				if ep != home {
					out = append(out, ep)
				}
			}
		}
		return out
	}()
	// holdGroups credits n distinct groups to an endpoint.
	holdGroups := func(p *Affinity, ep string, n int) {
		for g := range n {
			p.Index.Credit(ep, []uint64{uint64(1000*len(ep) + g)}, 0)
		}
	}
	tests := []struct {
		name    string
		sharing float64
		setup   func(p *Affinity)
		want    func(ep string) error
	}{
		{"shared prompts: the rendezvous winner, whatever this gateway's own load", 0.9, func(p *Affinity) {
			for _, ep := range others {
				holdGroups(p, ep, 1)
			}
			holdGroups(p, home, 1)
			p.InFlight.Start(home) // within the bounded load, which the other gateway may not see
		}, func(ep string) error {
			if ep != home {
				return fmt.Errorf("chose %s, not the rendezvous winner %s", ep, home)
			}
			return nil
		}},
		{"shared prompts: not an endpoint over the group bound", 0.9, func(p *Affinity) {
			holdGroups(p, home, 3)
			holdGroups(p, others[0], 1)
		}, func(ep string) error {
			// 4 groups + this one over 5 endpoints, ε 0.5: an endpoint may hold fewer than ⌈1.5⌉ = 2.
			if ep == home || ep == others[0] {
				return fmt.Errorf("chose %s, which holds too many groups", ep)
			}
			return nil
		}},
		{"shared prompts: a group the index aged out goes back where it was, over the group bound", 0.9, func(p *Affinity) {
			if got := pick(t, p); got != home { // placed, then aged out by other replicas' churn
				t.Fatalf("first placement at %s, want %s", got, home)
			}
			p.Index.Churn(home, p.Index.Capacity(home))
			holdGroups(p, home, 3)
			holdGroups(p, others[0], 1)
		}, func(ep string) error {
			if ep != home {
				return fmt.Errorf("chose %s, not %s where the group was until the index aged it out", ep, home)
			}
			return nil
		}},
		{"prompts rarely shared: the least loaded, the one served longest ago among equals", 0.1, func(p *Affinity) {
			for _, ep := range others[1:] {
				p.InFlight.Start(ep)
				p.InFlight.Done(ep)
			}
			p.InFlight.Start(home) // busier
		}, func(ep string) error {
			if ep != others[0] {
				return fmt.Errorf("chose %s, want the never-used idle endpoint %s", ep, others[0])
			}
			return nil
		}},
		{"prompts rarely shared: served longest ago", 0.1, func(p *Affinity) {
			for _, ep := range append(others[1:], others[0]) {
				p.InFlight.Start(ep)
				p.InFlight.Done(ep)
			}
			p.InFlight.Start(home)
		}, func(ep string) error {
			if ep != others[1] {
				return fmt.Errorf("chose %s, want %s (idle longest)", ep, others[1])
			}
			return nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPicker(tc.sharing, &fleet.InFlight{})
			tc.setup(p)
			if err := tc.want(pick(t, p)); err != nil {
				t.Error(err)
			}
		})
	}
}

// The share of prompts matching a held prefix decides how new ones are placed, and follows the traffic.
func TestSharingFollowsTraffic(t *testing.T) {
	snap, m := affinitySnap(t)
	p := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
	if got := p.noteSharing(false); got != initialSharing {
		t.Fatalf("initial sharing %.2f", got)
	}
	for i := range 100 {
		if _, err := p.Pick(snap, Input{Model: m, Request: request(t, fmt.Sprintf("unique prompt %d %s", i, strings.Repeat("x", 300)), "q")}); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.noteSharing(false); got >= consistentPlacement {
		t.Errorf("after 100 unshared prompts sharing is %.2f, want < %.2f", got, consistentPlacement)
	}
	for range 100 {
		if _, err := p.Pick(snap, Input{Model: m, Request: request(t, "one system prompt "+strings.Repeat("y", 300), "q")}); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.noteSharing(true); got < 0.9 {
		t.Errorf("after 100 prompts of one group sharing is %.2f, want ≥ 0.9", got)
	}
}
