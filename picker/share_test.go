package picker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/openai"
)

// syncBus delivers every placement at once to the other members, as Redis pub/sub does a moment later.
type syncBus struct {
	members []*Affinity
	sent    []Placement
}

type syncEnd struct {
	b    *syncBus
	from *Affinity
}

func (e syncEnd) Publish(pl Placement) {
	e.b.sent = append(e.b.sent, pl)
	for _, m := range e.b.members {
		if m != e.from {
			m.Learn(pl)
		}
	}
}

// sharing links n new pickers by a syncBus.
func sharing(n int) ([]*Affinity, *syncBus) {
	b := &syncBus{}
	for range n {
		a := newTestAffinity()
		a.Placements = syncEnd{b: b, from: a}
		b.members = append(b.members, a)
	}
	return b.members, b
}

func TestSharedPlacementsKeepManyReplicasTogether(t *testing.T) {
	snap, m := affinitySnap(t)
	for _, maxInFlight := range []int{0, 12} {
		one := groupHitRate(t, snap, m, []*Affinity{newTestAffinity()}, maxInFlight)
		var alone []*Affinity
		for range 8 {
			alone = append(alone, newTestAffinity())
		}
		apart := groupHitRate(t, snap, m, alone, maxInFlight)
		together, bus := sharing(8)
		shared := groupHitRate(t, snap, m, together, maxInFlight)
		t.Logf("up to %d in flight: hit rate one replica %.3f; eight replicas %.3f alone, %.3f sharing (%d placements for 1,024 requests)",
			maxInFlight, one, apart, shared, len(bus.sent))
		if shared < one-0.02 {
			t.Errorf("up to %d in flight: eight sharing replicas reach %.3f, more than 2 points below one replica's %.3f", maxInFlight, shared, one)
		}
		if shared <= apart {
			t.Errorf("up to %d in flight: sharing placements (%.3f) did not beat replicas alone (%.3f)", maxInFlight, shared, apart)
		}
		if len(bus.sent) > 1024/10 {
			t.Errorf("up to %d in flight: %d placements published for 1,024 requests: sharing should cost a message per new copy of a group, not per request", maxInFlight, len(bus.sent))
		}
	}
}

func TestPlacementsPublishedAndLearnt(t *testing.T) {
	snap, m := affinitySnap(t)
	pickers, bus := sharing(2)
	a, b := pickers[0], pickers[1]
	a.PolicyChanged(snap)
	b.PolicyChanged(snap)
	sys := strings.Repeat("A shared system prompt for the support desk. ", 40)
	d, err := a.Pick(snap, Input{Model: m, Request: request(t, sys, "first")})
	if err != nil {
		t.Fatal(err)
	}
	ep := d.Endpoints[0]
	if len(bus.sent) != 1 || bus.sent[0].Endpoint != ep || bus.sent[0].Forgotten || len(bus.sent[0].Hashes) == 0 {
		t.Fatalf("a new group published %+v, want one placement on %s", bus.sent, ep)
	}
	// The other replica sends the group where the first started it, and publishes nothing: it is not new there.
	d2, err := b.Pick(snap, Input{Model: m, Request: request(t, sys, "second")})
	if err != nil {
		t.Fatal(err)
	}
	if d2.Endpoints[0] != ep || d2.ExpectedCachedTokens == 0 {
		t.Errorf("the second replica chose %s expecting %d cached tokens, want %s where the group was placed", d2.Endpoints[0], d2.ExpectedCachedTokens, ep)
	}
	if len(bus.sent) != 1 {
		t.Errorf("following a held group published %d placements, want none", len(bus.sent)-1)
	}
	// The engine answered with nothing cached: the group was evicted. Both replicas forget it there.
	b.Observe(d2, openai.Usage{PromptTokens: 500, CachedTokens: 0, CachedReported: true})
	if len(bus.sent) != 2 || !bus.sent[1].Forgotten || bus.sent[1].Endpoint != ep {
		t.Fatalf("an eviction found published %+v, want a Forgotten placement on %s", bus.sent[1:], ep)
	}
	probe := request(t, sys, "third")
	pr, release := promptOf(a, Input{Model: m, Request: probe})
	defer release()
	if n := a.Index.Match(ep, pr.hashes); n != 0 {
		t.Errorf("the first replica still believes %s holds %d blocks of the evicted group", ep, n)
	}
}

func TestLearnIsBounded(t *testing.T) {
	snap, _ := affinitySnap(t)
	a := newTestAffinity()
	a.PolicyChanged(snap)
	hashes := make([]uint64, MaxSharedBlocks+50)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	tests := []struct {
		name string
		pl   Placement
		ok   bool
	}{
		{"an endpoint of the policy", Placement{Endpoint: "10.0.0.1:1", Hashes: hashes[:8]}, true},
		{"an endpoint the policy does not list", Placement{Endpoint: "10.9.9.9:1", Hashes: hashes[:8]}, false},
		{"no blocks", Placement{Endpoint: "10.0.0.2:1"}, false},
		{"no endpoint", Placement{Hashes: hashes[:8]}, false},
		{"too many blocks and a huge capacity", Placement{Endpoint: "10.0.0.3:1", Hashes: hashes, Capacity: 1 << 40}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Learn(tc.pl); got != tc.ok {
				t.Errorf("Learn = %v, want %v", got, tc.ok)
			}
		})
	}
	if n := a.Index.Match("10.0.0.3:1", hashes); n != MaxSharedBlocks {
		t.Errorf("learnt %d blocks, want the first %d", n, MaxSharedBlocks)
	}
	if c := a.Index.Capacity("10.0.0.3:1"); c != DefaultIndexBlocks {
		t.Errorf("a capacity of 2^40 blocks made an index of %d, want the default %d", c, DefaultIndexBlocks)
	}
	if a.Index.Capacity("10.9.9.9:1") != 0 {
		t.Error("an endpoint the policy does not list was indexed")
	}
	// An endpoint this replica has indexed keeps its size.
	a.Index.Credit("10.0.0.4:1", hashes[:4], 100)
	a.Learn(Placement{Endpoint: "10.0.0.4:1", Hashes: hashes[4:8], Capacity: 5000})
	if c := a.Index.Capacity("10.0.0.4:1"); c != 100 {
		t.Errorf("a learnt placement resized an index of 100 blocks to %d", c)
	}
	// Forgotten drops the blocks it names.
	a.Learn(Placement{Endpoint: "10.0.0.1:1", Hashes: hashes[:1], Forgotten: true})
	if n := a.Index.Match("10.0.0.1:1", hashes[:8]); n != 0 {
		t.Errorf("after a Forgotten placement of its first block, %d blocks still match", n)
	}
}

// Distinct prompts that never come back publish nothing once the picker has seen that they do not.
func TestDistinctPromptsPublishNothing(t *testing.T) {
	snap, m := affinitySnap(t)
	pickers, bus := sharing(2)
	for i := range 200 {
		sys := fmt.Sprintf("Prompt %d: %s", i, strings.Repeat("a distinct document to summarise ", 30))
		if _, err := pickers[i%2].Pick(snap, Input{Model: m, Request: request(t, sys, "summarise")}); err != nil {
			t.Fatal(err)
		}
	}
	if len(bus.sent) > 60 {
		t.Errorf("200 distinct prompts published %d placements; once prompts are seen not to come back, none should be", len(bus.sent))
	}
}

// A replica's own requests add blocks to the engine's cache that no placement carries (the tails of prompts in
// held groups): it counts them from the engine's usage (prompt tokens not served from its cache), reports them
// once per ChurnEvery, and the other replica's index ages by as many.
func TestChurnReportsWhatPlacementsDoNotCarry(t *testing.T) {
	snap, m := affinitySnap(t)
	pickers, bus := sharing(2)
	a, b := pickers[0], pickers[1]
	now := time.Unix(1000, 0)
	for _, p := range pickers {
		p.ChurnEvery = time.Second
		p.churn.now = func() time.Time { return now }
		p.PolicyChanged(snap)
	}
	sys := strings.Repeat("A shared system prompt for the support desk. ", 40)
	pick := func(user string) Decision {
		t.Helper()
		d, err := a.Pick(snap, Input{Model: m, Request: request(t, sys, user)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// served reports the engine's usage for d: the estimated prompt, all but uncached tokens from the cache.
	served := func(d Decision, uncached int) {
		prompt := int64(d.EstimatedPromptTokens)
		a.Observe(d, openai.Usage{PromptTokens: prompt, CachedTokens: prompt - int64(uncached), CachedReported: true})
	}
	d := pick("first")
	ep := d.Endpoints[0]
	used := func() int32 {
		b.Index.mu.Lock()
		defer b.Index.mu.Unlock()
		return b.Index.endpoints[ep].free
	}
	served(d, d.EstimatedPromptTokens) // a new group: its blocks went out with its placement
	before, sent := used(), len(bus.sent)
	d = pick("A question about an invoice that nobody asked before, and a long one.")
	served(d, 160) // ten blocks of 16 tokens the engine had not cached
	if len(bus.sent) != sent {
		t.Fatalf("a held group's request published %+v before the report was due", bus.sent[sent:])
	}
	now = now.Add(time.Second)
	d = pick("first")
	served(d, 0)
	if len(bus.sent) != sent+1 || bus.sent[sent].Endpoint != ep || bus.sent[sent].Churn != 10 || bus.sent[sent].Hashes != nil {
		t.Fatalf("the report due published %+v, want one churn report of 10 blocks on %s", bus.sent[sent:], ep)
	}
	if got := used() - before; got != 10 {
		t.Errorf("the other replica's index took %d unmatched blocks for a report of 10", got)
	}
	now = now.Add(time.Second)
	served(pick("first"), 0)
	if len(bus.sent) != sent+1 {
		t.Errorf("an interval without new blocks published %+v", bus.sent[sent+1:])
	}
}

func TestLRUFading(t *testing.T) {
	l := newLRU(8)
	l.add(1)
	if l.fading(1) {
		t.Error("the only block of an LRU an eighth full is fading")
	}
	for _, h := range []uint64{2, 3, 4, 5, 6, 7} {
		l.add(h)
	}
	if !l.fading(1) || l.fading(7) {
		t.Errorf("in an LRU seven eighths full, fading(oldest) = %v, fading(newest) = %v; want true, false", l.fading(1), l.fading(7))
	}
	l = newLRU(4)
	for _, h := range []uint64{1, 2, 3, 4} { // full: 1 is the least recently used, 4 the most
		l.add(h)
	}
	tests := []struct {
		hash uint64
		want bool
	}{{1, true}, {2, true}, {3, false}, {4, false}, {99, false}}
	for _, tc := range tests {
		if got := l.fading(tc.hash); got != tc.want {
			t.Errorf("fading(%d) = %v, want %v", tc.hash, got, tc.want)
		}
	}
	l.touch(1)
	if l.fading(1) {
		t.Error("a block just used is fading")
	}
}

// A group two replicas keep using fades in the index of the one that uses it less, as placements of other
// groups pass through it; that replica then publishes it again when it next uses it, once.
func TestFadingGroupsArePublishedAgain(t *testing.T) {
	snap, m := affinitySnap(t)
	pickers, bus := sharing(2)
	a, b := pickers[0], pickers[1]
	for _, p := range pickers {
		p.IndexBlocks = 200
		p.PolicyChanged(snap)
	}
	system := func(g int) string { return strings.Repeat(fmt.Sprintf("System prompt of group %d. ", g), 60) }
	d, err := a.Pick(snap, Input{Model: m, Request: request(t, system(0), "first")})
	if err != nil {
		t.Fatal(err)
	}
	ep := d.Endpoints[0]
	probe, release := promptOf(b, Input{Model: m, Request: request(t, system(0), "probe")})
	group := GroupKey(probe.hashes)
	release()
	fading := func() bool {
		b.Index.mu.Lock()
		defer b.Index.mu.Unlock()
		l, ok := b.Index.endpoints[ep]
		return ok && l.fading(group)
	}
	for g := 1; !fading(); g++ {
		if g > 200 {
			t.Fatal("group 0 never faded in the second replica's index")
		}
		for _, q := range []string{"first", "second"} { // prompts that come back: the replicas keep sharing
			if _, err := a.Pick(snap, Input{Model: m, Request: request(t, system(g), q)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	sent := len(bus.sent)
	d, err = b.Pick(snap, Input{Model: m, Request: request(t, system(0), "again")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoints[0] != ep || d.ExpectedCachedTokens == 0 {
		t.Fatalf("the fading group went to %s expecting %d cached tokens, want %s where it is held", d.Endpoints[0], d.ExpectedCachedTokens, ep)
	}
	if len(bus.sent) != sent+1 || bus.sent[sent].Endpoint != ep || bus.sent[sent].Forgotten {
		t.Fatalf("using a fading group published %+v, want one placement on %s", bus.sent[sent:], ep)
	}
	if _, err := b.Pick(snap, Input{Model: m, Request: request(t, system(0), "once more")}); err != nil {
		t.Fatal(err)
	}
	if len(bus.sent) != sent+1 {
		t.Errorf("using the group again right after renewing it published %d more placements, want none", len(bus.sent)-sent-1)
	}
}

// While prompts do not come back, a replica reports no churn: nothing the others hold is worth the messages.
func TestDistinctPromptsReportNoChurn(t *testing.T) {
	snap, m := affinitySnap(t)
	pickers, bus := sharing(2)
	a := pickers[0]
	now := time.Unix(1000, 0)
	a.ChurnEvery = time.Second
	a.churn.now = func() time.Time { return now }
	a.PolicyChanged(snap)
	for i := range 200 {
		d, err := a.Pick(snap, Input{Model: m, Request: request(t, strings.Repeat(fmt.Sprintf("System prompt number %d. ", i), 20), "a question")})
		if err != nil {
			t.Fatal(err)
		}
		prompt := int64(d.EstimatedPromptTokens)
		a.Observe(d, openai.Usage{PromptTokens: prompt, CachedTokens: 0, CachedReported: true})
		now = now.Add(time.Second)
	}
	for _, pl := range bus.sent {
		if pl.Churn > 0 {
			t.Fatalf("distinct prompts reported churn: %+v", pl)
		}
	}
}

// promptOf hashes a request's prompt as a decision does (release gives the buffer back).
func promptOf(p *Affinity, in Input) (prompt, func()) {
	d := decision{p: p, in: in}
	d.hashPrompt(0)
	return d.prompt, d.release
}
