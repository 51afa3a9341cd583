package picker

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// rolloutPolicy: mixedPolicy with the "cheap" pool as the candidate of a rollout (or, with servedAs, a served
// model name on both pools).
func rolloutPolicy(t *testing.T, candidate string) (*policies.Snapshot, *policies.Model, *policies.RolloutPlan) {
	t.Helper()
	src := strings.Replace(mixedPolicy, "    fallbacks:", "    rollout:\n      candidate: "+candidate+
		"\n      steps: [{percent: 5}, {percent: 25}, {percent: 100}]\n      testers: [pro]\n    fallbacks:", 1)
	snap, m := modelOf(t, src)
	plan, ok := snap.Rollout(m)
	if !ok {
		t.Fatal("no rollout plan")
	}
	return snap, m, plan
}

func TestSplitTakesTheShareByGroupAndKeepsIt(t *testing.T) {
	_, _, plan := rolloutPolicy(t, "{pool: cheap}")
	const groups = 20000
	inCandidate := func(share float64) map[uint64]bool {
		s := &Split{Plan: plan, Share: share}
		out := map[uint64]bool{}
		for g := range groups {
			key := xxh3.HashString(fmt.Sprint("group", g))
			if s.arm("m", key) == ArmCandidate {
				out[key] = true
			}
		}
		return out
	}
	five, quarter := inCandidate(0.05), inCandidate(0.25)
	for share, got := range map[float64]int{0.05: len(five), 0.25: len(quarter)} {
		if frac := float64(got) / groups; math.Abs(frac-share) > 0.01 {
			t.Errorf("share %v: %.3f of groups took the candidate", share, frac)
		}
	}
	for key := range five {
		if !quarter[key] {
			t.Fatal("a group in the candidate at 5% left it at 25%")
		}
	}
	if len(inCandidate(0)) != 0 || len(inCandidate(1)) != groups {
		t.Error("share 0 must send every group to the baseline and 1 every group to the candidate")
	}
}

// The rollout's secret seed keys the arms: a client that knows its conversation's hash and the share still
// cannot tell its arm, since under another seed a different half of the groups takes the candidate; under one
// seed the arms are stable, as every replica must compute them.
func TestSplitIsKeyedByTheRolloutsSeed(t *testing.T) {
	_, _, plan := rolloutPolicy(t, "{pool: cheap}")
	const groups = 20000
	arms := func(seed uint64) []string {
		s := &Split{Plan: plan, Share: 0.5, Seed: seed}
		out := make([]string, groups)
		for g := range out {
			out[g] = s.arm("m", xxh3.HashString(fmt.Sprint("conversation-", g)))
		}
		return out
	}
	a, again, b := arms(0x1234_5678_9abc_def1), arms(0x1234_5678_9abc_def1), arms(0x0fed_cba9_8765_4321)
	var differ int
	for g := range a {
		if a[g] != again[g] {
			t.Fatal("one seed put a conversation in two arms")
		}
		if a[g] != b[g] {
			differ++
		}
	}
	// Independent halves agree on half the groups: 10,000 ± 3σ (σ ≈ 71).
	if differ < 9_780 || differ > 10_220 {
		t.Errorf("%d of %d conversations change arm with the seed, want about half", differ, groups)
	}
}

func TestPickFollowsTheSplit(t *testing.T) {
	snap, m, plan := rolloutPolicy(t, "{pool: cheap}")
	p := newMixedPicker(idleEngines(nil))
	arms := map[string]int{}
	for conv := range 400 {
		sys := strings.Repeat(fmt.Sprintf("Conversation %d's system prompt. ", conv), 20)
		var first string
		for turn := range 3 {
			d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, fmt.Sprint("turn ", turn)), Split: &Split{Plan: plan, Share: 0.25}})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{ArmCandidate: "cheap", ArmBaseline: "fast"}[d.Arm]; d.Pool.Name != want {
				t.Fatalf("arm %q on pool %s", d.Arm, d.Pool.Name)
			}
			if turn == 0 {
				first = d.Arm
				arms[d.Arm]++
			} else if d.Arm != first {
				t.Fatalf("conversation %d moved from %s to %s", conv, first, d.Arm)
			}
		}
	}
	if frac := float64(arms[ArmCandidate]) / 400; frac < 0.18 || frac > 0.32 {
		t.Errorf("%.2f of conversations took the candidate at a 25%% share", frac)
	}
}

func TestSplitForcedSaturatedAndServedAs(t *testing.T) {
	snap, m, plan := rolloutPolicy(t, "{pool: cheap}")
	in := func(s *Split) Input { return Input{Model: m, Request: request(t, "sys", "q"), Split: s} }
	// A tester's header wins over the group.
	if d, err := newMixedPicker(idleEngines(nil)).Pick(snap, in(&Split{Plan: plan, Share: 0, Force: ArmCandidate})); err != nil || d.Pool.Name != "cheap" || d.Arm != ArmCandidate {
		t.Fatalf("forced candidate: %v %v", d.Pool, err)
	}
	// The candidate's engines are saturated: the request goes to the baseline, not to a 429.
	busy := idleEngines(func(ep string, e *fleet.EngineMetrics) {
		if strings.HasPrefix(ep, "10.0.1.") {
			e.Waiting = 1000
		}
	})
	if d, err := newMixedPicker(busy).Pick(snap, in(&Split{Plan: plan, Share: 1})); err != nil || d.Pool.Name != "fast" || d.Arm != ArmBaseline {
		t.Fatalf("saturated candidate: %+v %v", d, err)
	}
	// A candidate that is a served model name runs on the baseline's pools under that name.
	snap2, m2, plan2 := rolloutPolicy(t, "{servedModel: m-int4}")
	d, err := newMixedPicker(idleEngines(nil)).Pick(snap2, Input{Model: m2, Request: request(t, "sys", "q"), Split: &Split{Plan: plan2, Share: 1}})
	if err != nil || d.Arm != ArmCandidate || d.Served() != "m-int4" {
		t.Fatalf("served-model candidate: arm %q served %q (%v)", d.Arm, d.Served(), err)
	}
	d, _ = newMixedPicker(idleEngines(nil)).Pick(snap2, Input{Model: m2, Request: request(t, "sys", "q"), Split: &Split{Plan: plan2, Share: 0}})
	if d.Arm != ArmBaseline || d.Served() == "m-int4" {
		t.Fatalf("baseline of a served-model rollout: arm %q served %q", d.Arm, d.Served())
	}
	if tenant, _ := snap.Tenant("pro"); !plan.Tester(tenant) {
		t.Error("pro is a tester")
	}
	if tenant, _ := snap.Tenant("free"); plan.Tester(tenant) {
		t.Error("free is not a tester")
	}
}

// Conversations behind one long shared system prompt are one prefix group; their conversation ids split them.
func TestSplitByConversationUnderASharedSystemPrompt(t *testing.T) {
	snap, m, plan := rolloutPolicy(t, "{pool: cheap}")
	p := newMixedPicker(idleEngines(nil))
	sys := strings.Repeat("Everyone's long system prompt. ", 40)
	for _, tc := range []struct {
		name    string
		conv    bool
		atLeast int
		atMost  int
	}{
		{"by prefix group: all or nothing", false, 0, 0},
		{"by conversation", true, 60, 140},
	} {
		candidates := 0
		for conv := range 400 {
			s := &Split{Plan: plan, Share: 0.25}
			if tc.conv {
				s.Conversation = xxh3.HashString(fmt.Sprint("conv-", conv)) | 1
			}
			d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, fmt.Sprint("question ", conv)), Split: s})
			if err != nil {
				t.Fatal(err)
			}
			if d.Arm == ArmCandidate {
				candidates++
			}
		}
		if !tc.conv {
			if candidates != 0 && candidates != 400 {
				t.Errorf("%s: %d of 400 on the candidate, want all or none", tc.name, candidates)
			}
			continue
		}
		if candidates < tc.atLeast || candidates > tc.atMost {
			t.Errorf("%s: %d of 400 on the candidate at a 25%% share", tc.name, candidates)
		}
	}
}
