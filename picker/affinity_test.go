package picker

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
)

func chatPrompt(t testing.TB, system, user string) []byte {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`, system, user)
	r, err := openai.ParseRequest(openai.EndpointChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r.Prompt
}

func TestPrefixHashes(t *testing.T) {
	h := Hasher{BlockBytes: 64, MaxBlocks: 1000}
	system := strings.Repeat("You are a careful assistant. ", 40) // ~1160 bytes
	a := h.Hash(nil, Seed("m", ""), chatPrompt(t, system, "first question"))
	b := h.Hash(nil, Seed("m", ""), chatPrompt(t, system, "a different, longer second question"))
	other := h.Hash(nil, Seed("other-model", ""), chatPrompt(t, system, "first question"))
	shared := 0
	for shared < min(len(a), len(b)) && a[shared] == b[shared] {
		shared++
	}
	if want := (len(`"system"`) + 1 + len(system) + 2) / 64; shared != want {
		t.Errorf("shared leading blocks = %d, want %d (the system prompt's full blocks)", shared, want)
	}
	if a[0] == other[0] {
		t.Error("the same text under another model must hash differently")
	}
	if capped := (Hasher{BlockBytes: 64, MaxBlocks: 3}).Hash(nil, 1, chatPrompt(t, system, "q")); len(capped) != 3 {
		t.Errorf("MaxBlocks not honoured: %d", len(capped))
	}
	// Multi-part content and images are part of the prefix.
	v1 := []byte(`[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x", 100) + `"},{"type":"image_url","image_url":{"url":"https://a/1.png"}}]}]`)
	v2 := []byte(`[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("x", 100) + `"},{"type":"image_url","image_url":{"url":"https://a/2.png"}}]}]`)
	h1, h2 := h.Hash(nil, 1, v1), h.Hash(nil, 1, v2)
	if len(h1) < 2 || len(h1) != len(h2) || h1[0] != h2[0] || h1[len(h1)-1] == h2[len(h2)-1] {
		t.Errorf("image parts: %v vs %v", h1, h2)
	}
}

func TestPrefixHashingAllocatesNothingPerBlock(t *testing.T) {
	prompt := chatPrompt(t, strings.Repeat("lorem ipsum dolor sit amet ", 2500), "q") // ~64 KiB
	h := Hasher{BlockBytes: 64, MaxBlocks: 2048}
	dst := make([]uint64, 0, 2048)
	allocs := testing.AllocsPerRun(20, func() { dst = h.Hash(dst[:0], 7, prompt) })
	if allocs != 0 && !raceEnabled {
		t.Errorf("%v allocations per 64 KiB prompt, want 0", allocs)
	}
	if len(dst) < 1000 {
		t.Errorf("%d blocks", len(dst))
	}
}

// BenchmarkPrefixHash64KiB: go test ./picker -run '^$' -bench PrefixHash -benchmem
func BenchmarkPrefixHash64KiB(b *testing.B) {
	prompt := chatPrompt(b, strings.Repeat("lorem ipsum dolor sit amet ", 2500), "q")
	h := Hasher{BlockBytes: 64, MaxBlocks: 2048}
	dst := make([]uint64, 0, 2048)
	b.SetBytes(64 << 10)
	b.ReportAllocs()
	for b.Loop() {
		dst = h.Hash(dst[:0], 7, prompt)
	}
}

func TestLRU(t *testing.T) {
	l := newLRU(3)
	for _, h := range []uint64{1, 2, 3} {
		l.add(h)
	}
	l.touch(1) // 2 is now the least recently used
	l.add(4)
	if _, ok := l.index[2]; ok {
		t.Error("least recently used entry survived")
	}
	for _, h := range []uint64{1, 3, 4} {
		if _, ok := l.index[h]; !ok {
			t.Errorf("%d evicted", h)
		}
	}
	x := NewIndex()
	x.Credit("e", []uint64{10, 11, 12}, 100)
	tests := []struct {
		hashes []uint64
		want   int
	}{{[]uint64{10, 11, 12, 13}, 3}, {[]uint64{10, 99, 12}, 1}, {[]uint64{99}, 0}, {nil, 0}}
	for _, tc := range tests {
		if got := x.Match("e", tc.hashes); got != tc.want {
			t.Errorf("Match(%v) = %d, want %d", tc.hashes, got, tc.want)
		}
	}
	if x.Match("unknown", []uint64{10}) != 0 {
		t.Error("unknown endpoint matched")
	}
	// Crediting a prompt uses its head last, as the engine frees a request's blocks tail first: under
	// pressure the index loses a prefix's end, and what is left still matches from the first block.
	y := NewIndex()
	y.Credit("e", []uint64{1, 2, 3, 4}, 6)
	y.Credit("e", []uint64{21, 22, 23}, 6) // one block must go: 4, not 1
	if got := y.Match("e", []uint64{1, 2, 3, 4}); got != 3 {
		t.Errorf("after one eviction Match = %d, want 3 (the tail evicted first)", got)
	}
	// A group block aged out is remembered (AgedOut) until it is held again or the ring of them turns over.
	g := GroupKey([]uint64{1, 2, 3, 4})
	y.Churn("e", 6)
	if !y.AgedOut("e", g) || y.AgedOut("e", 99) || y.AgedOut("other", g) {
		t.Error("AgedOut does not report the group aged out, and only it")
	}
	y.Credit("e", []uint64{1, 2, 3, 4}, 6)
	if y.AgedOut("e", g) {
		t.Error("a group held again still reported aged out")
	}
	z := NewIndex()
	for i := range uint64(minGhosts + 2) { // one-block groups, each aging the previous out
		z.Credit("e", []uint64{1000 + i}, 1)
	}
	if z.AgedOut("e", 1000) || !z.AgedOut("e", 1001) || !z.AgedOut("e", 1000+minGhosts) || z.AgedOut("e", 1001+minGhosts) {
		t.Errorf("the ring of aged-out groups keeps the wrong ones")
	}
	// A group held again and aged out again stands at its later place in the ring: when the ring comes round to
	// its earlier place, it is not forgotten.
	r := NewIndex()
	r.Credit("e", []uint64{1}, 1)
	r.Credit("e", []uint64{2}, 1) // 1 ages out: the ring's place 0
	r.Credit("e", []uint64{1}, 1) // 1 held again; 2 ages out: place 1
	r.Credit("e", []uint64{3}, 1) // 1 ages out again: place 2
	for i := range uint64(minGhosts - 2) {
		r.Credit("e", []uint64{100 + i}, 1) // 3, 100, 101, … age out: places 3 to minGhosts-1, then 0
	}
	if !r.AgedOut("e", 1) {
		t.Error("the ring overwrote a group's earlier place and forgot the group, which stands later in it")
	}
	if !r.AgedOut("e", 2) || r.AgedOut("e", 100+minGhosts-3) {
		t.Error("the ring keeps the wrong groups after coming round")
	}
}

func affinitySnap(t *testing.T) (*policies.Snapshot, *policies.Model) { return modelOf(t, testPolicy) }

// modelOf parses a test policy and returns it with its model "m".
func modelOf(t *testing.T, policy string) (*policies.Snapshot, *policies.Model) {
	t.Helper()
	snap, err := policies.Parse("p.yaml", []byte(policy))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	return snap, m
}

func request(t testing.TB, system, user string) *openai.Request {
	return &openai.Request{Prompt: chatPrompt(t, system, user)}
}

func TestAffinityScoring(t *testing.T) {
	snap, m := affinitySnap(t)
	sys := strings.Repeat("Group A system prompt with rules. ", 30)
	tests := []struct {
		name  string
		load  map[string]int
		warm  string // endpoint credited with the prefix beforehand
		check func(t *testing.T, d Decision)
	}{
		{"warm endpoint wins", nil, "10.0.0.3:1", func(t *testing.T, d Decision) {
			if d.Endpoints[0] != "10.0.0.3:1" {
				t.Errorf("chose %v", d.Endpoints)
			}
		}},
		{"overloaded warm endpoint is skipped (bounded load)", map[string]int{"10.0.0.3:1": 20, "10.0.0.1:1": 1}, "10.0.0.3:1", func(t *testing.T, d Decision) {
			if d.Endpoints[0] == "10.0.0.3:1" {
				t.Errorf("chose the overloaded endpoint %v", d.Endpoints)
			}
		}},
		{"fallbacks come from the chosen pool", nil, "10.0.0.2:1", func(t *testing.T, d Decision) {
			if d.Pool.Name != "a" || len(d.Endpoints) != 3 {
				t.Errorf("decision %s %v", d.Pool.Name, d.Endpoints)
			}
			for _, e := range d.Endpoints {
				if !strings.HasPrefix(e, "10.0.0.") {
					t.Errorf("fallback %s outside pool a", e)
				}
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inflight := inFlight(tc.load)
			p := &Affinity{InFlight: inflight, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
			r := request(t, sys, "question")
			if tc.warm != "" {
				p.Index.Credit(tc.warm, p.Hasher.Hash(nil, Seed("m", ""), r.Prompt), 0)
			}
			d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, "another question")})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, d)
		})
	}
}

func TestColdPrefixRendezvousAgreesAcrossReplicas(t *testing.T) {
	snap, m := affinitySnap(t)
	a := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
	b := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
	spread := map[string]bool{}
	for g := range 40 {
		sys := fmt.Sprintf("Group %d: %s", g, strings.Repeat("shared instructions for this group. ", 20))
		da, _ := a.Pick(snap, Input{Model: m, Request: request(t, sys, "q1")})
		db, _ := b.Pick(snap, Input{Model: m, Request: request(t, sys, "q2")})
		if da.Endpoints[0] != db.Endpoints[0] {
			t.Errorf("group %d: replicas chose %s and %s", g, da.Endpoints[0], db.Endpoints[0])
		}
		spread[da.Endpoints[0]] = true
	}
	if len(spread) < 4 {
		t.Errorf("40 groups landed on only %d of 5 endpoints", len(spread))
	}
}

// Two gateway replicas receiving alternate requests of one workload keep ≥ 90 % of one replica's hit rate, with
// the fleet idle and with requests in flight (each replica then sees different loads).
func TestTwoReplicasKeepAffinity(t *testing.T) {
	snap, m := affinitySnap(t)
	for _, maxInFlight := range []int{0, 12} {
		one := groupHitRate(t, snap, m, []*Affinity{newTestAffinity()}, maxInFlight)
		two := groupHitRate(t, snap, m, []*Affinity{newTestAffinity(), newTestAffinity()}, maxInFlight)
		t.Logf("up to %d in flight: hit rate one replica %.3f, two replicas %.3f", maxInFlight, one, two)
		if two < 0.9*one {
			t.Errorf("up to %d in flight: two replicas reach %.3f, below 90%% of one replica's %.3f", maxInFlight, two, one)
		}
	}
}

func newTestAffinity() *Affinity {
	return &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
}

// groupHitRate sends 16 groups × 64 prompts, shuffled, to the pickers in turn and returns the share that found
// their group cached; with maxInFlight > 0 each request stays in flight for a random number (up to maxInFlight)
// of the requests that follow it.
func groupHitRate(t *testing.T, snap *policies.Snapshot, m *policies.Model, pickers []*Affinity, maxInFlight int) float64 {
	t.Helper()
	type req struct{ group, i int }
	var work []req
	for g := range 16 {
		for i := range 64 {
			work = append(work, req{g, i})
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
	systems := make([]string, 16)
	for g := range systems {
		systems[g] = fmt.Sprintf("Tenant group %d. %s", g, strings.Repeat("Follow the policy handbook precisely. ", 150))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	type flight struct {
		p         *Affinity
		ep        string
		endsAfter int
	}
	var flying []flight
	// The replicas' real caches: each holds its four most recently served groups (16 groups, 5 replicas:
	// the fleet holds every group once, not twice).
	cached := map[string][]int{}
	hits := 0
	for k, w := range work {
		kept := flying[:0]
		for _, f := range flying {
			if f.endsAfter <= k {
				f.p.InFlight.Done(f.ep)
			} else {
				kept = append(kept, f)
			}
		}
		flying = kept
		p := pickers[k%len(pickers)]
		d, err := p.Pick(snap, Input{Model: m, Request: request(t, systems[w.group], fmt.Sprintf("question %d", w.i))})
		if err != nil {
			t.Fatal(err)
		}
		ep := d.Endpoints[0]
		if maxInFlight > 0 {
			p.InFlight.Start(ep)
			flying = append(flying, flight{p, ep, k + 1 + rng.IntN(maxInFlight)})
		}
		if i := slices.Index(cached[ep], w.group); i >= 0 {
			hits++
			cached[ep] = slices.Delete(cached[ep], i, i+1)
		}
		cached[ep] = append(cached[ep], w.group)
		if len(cached[ep]) > 4 {
			cached[ep] = cached[ep][1:]
		}
	}
	return float64(hits) / float64(len(work))
}

// BenchmarkAffinityPick: one decision for a 2 KiB chat prompt over five endpoints, ranked by score
// (affinity) and placed by predicted timing and cost under a TTFT target (slo), without and with engine
// metrics (the load then includes the engines' running batches).
func BenchmarkAffinityPick(b *testing.B) {
	for _, mode := range []struct {
		name, policy string
		engines      bool
	}{
		{"affinity", testPolicy, false},
		{"affinity+engines", testPolicy, true},
		{"slo", strings.Replace(testPolicy, "  models:", "  slo: {ttft: 1s, tpot: 50ms}\n  models:", 1), false},
	} {
		withEngines := mode.engines
		b.Run(mode.name, func(b *testing.B) {
			snap, err := policies.Parse("p.yaml", []byte(mode.policy))
			if err != nil {
				b.Fatal(err)
			}
			m, _ := snap.Model("m")
			p := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64, MaxBlocks: 256}}
			if withEngines {
				e := engines{}
				for i := range snap.Policy.Spec.Models[0].Pools {
					for _, ep := range snap.Policy.Spec.Models[0].Pools[i].Endpoints {
						e[ep] = fleet.EngineMetrics{Running: 3, NumBlocks: 4096, At: time.Now()}
					}
				}
				p.Engines = e
			}
			r := request(b, strings.Repeat("You are a helpful assistant. ", 70), "q")
			b.ReportAllocs()
			for b.Loop() {
				d, err := p.Pick(snap, Input{Model: m, Request: r})
				if err != nil {
					b.Fatal(err)
				}
				if mode.name == "slo" && !d.Predicted.set {
					b.Fatal("no SLO placement")
				}
			}
		})
	}
}

type engines map[string]fleet.EngineMetrics

func (e engines) Metrics(addr string) (fleet.EngineMetrics, bool) { m, ok := e[addr]; return m, ok }

func TestSaturationAndOverflow(t *testing.T) {
	src := strings.Replace(testPolicy, "  tenants:", `    fallbacks:
    - {name: together, baseURL: "https://api.together.xyz/v1", model: provider-m, apiKeyFrom: "env:K", when: [saturated]}
  routing: {maxWaiting: 4, maxKVUtilisation: 0.9}
  tenants:`, 1)
	snap, err := policies.Parse("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	all := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1", "10.0.1.1:1"}
	fresh := func(mod func(string, *fleet.EngineMetrics)) engines {
		e := engines{}
		for _, ep := range all {
			em := fleet.EngineMetrics{}
			mod(ep, &em)
			e[ep] = em
		}
		return e
	}
	tests := []struct {
		name     string
		eng      engines
		model    *policies.Model
		wantEP   func(string) bool
		fallback bool
		status   int
	}{
		{"saturated endpoints are skipped", fresh(func(ep string, e *fleet.EngineMetrics) {
			if ep != "10.0.1.1:1" {
				e.Waiting = 10
			}
		}), m, func(ep string) bool { return ep == "10.0.1.1:1" }, false, 0},
		{"a KV wall that queues counts as saturated for prompts it does not hold", fresh(func(ep string, e *fleet.EngineMetrics) {
			if ep != "10.0.0.2:1" {
				e.KVUtil, e.Waiting = 0.95, 1 // full and already queueing
			}
		}), m, func(ep string) bool { return ep == "10.0.0.2:1" }, false, 0},
		{"all saturated: overflow to the fallback", fresh(func(_ string, e *fleet.EngineMetrics) { e.Waiting = 9 }), m, nil, true, 0},
		{"stale metrics: unavailable, the fallback is only for saturation: 503", engines{}, m, nil, false, 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}, Engines: tc.eng}
			d, err := p.Pick(snap, Input{Model: tc.model, Request: request(t, "system", "user")})
			if tc.status != 0 {
				var nc *NoCapacity
				if !errors.As(err, &nc) || nc.Saturated != (tc.status == 429) {
					t.Fatalf("want %d, got %v %v", tc.status, d, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.fallback {
				if d.Fallback == nil || d.Served() != "provider-m" || d.Target("m") != "fallback/m/together" {
					t.Fatalf("want the fallback, got %+v", d)
				}
				return
			}
			if !tc.wantEP(d.Endpoints[0]) {
				t.Errorf("chose %v", d.Endpoints)
			}
		})
	}
	// Without a fallback, saturation sheds with 429 and Retry-After.
	p := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Engines: fresh(func(_ string, e *fleet.EngineMetrics) { e.Waiting = 9 })}
	snap2, _ := policies.Parse("p.yaml", []byte(strings.Replace(testPolicy, "  tenants:", "  routing: {maxWaiting: 4}\n  tenants:", 1)))
	m2, _ := snap2.Model("m")
	_, err = p.Pick(snap2, Input{Model: m2, Request: request(t, "s", "u")})
	if nc, ok := err.(*NoCapacity); !ok || !nc.Saturated {
		t.Errorf("want saturation, got %v", err)
	}
}

// A decision and the response's usage, as in production: the engine's real prompt token count differs from the
// estimate by a little, differently each time, so the learnt ratio and with it the index capacity asked for
// wobble. Engines report 32,768 KV blocks (an 8B model on one 80 GB GPU). Before the index resized only on
// changes over 1/32, most decisions here copied an endpoint's whole LRU.
func BenchmarkPickAndObserve(b *testing.B) {
	snap, err := policies.Parse("p.yaml", []byte(testPolicy))
	if err != nil {
		b.Fatal(err)
	}
	m, _ := snap.Model("m")
	e := engines{}
	for _, ep := range snap.Policy.Spec.Models[0].Pools[0].Endpoints {
		e[ep] = fleet.EngineMetrics{Running: 3, NumBlocks: 32768, At: time.Now()}
	}
	p := &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64, MaxBlocks: 256}, Engines: e}
	r := request(b, strings.Repeat("You are a helpful assistant. ", 70), "q")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d, err := p.Pick(snap, Input{Model: m, Request: r})
		if err != nil {
			b.Fatal(err)
		}
		i++
		real := int64(d.EstimatedPromptTokens) * int64(100+i%5) / 100 // 0-4 % more than estimated
		p.Observe(d, openai.Usage{PromptTokens: real})
	}
}

// A decision says the load the picker saw at its endpoint — this gateway's own requests, or the engine's
// running batch plus this gateway's sends since its reading, if more — which the rollout gates match the arms'
// latencies by.
func TestDecisionCarriesTheLoadItSaw(t *testing.T) {
	snap, err := policies.Parse("p.yaml", []byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := snap.Model("m")
	all := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1", "10.0.1.1:1"}
	for _, tc := range []struct {
		name    string
		running float64 // every engine's batch; nil metrics when negative
		own     int     // this gateway's requests at every endpoint
		since   int     // more of them sent after the picker first saw the reading
		want    int64
	}{
		{"own requests, no engine metrics", -1, 1, 2, 3},
		{"the engine's batch, larger than the own requests", 6, 2, 0, 6},
		{"the batch and the sends since the reading", 6, 2, 3, 9},
		{"own requests beyond the batch and the sends since", 1, 4, 1, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inflight := &fleet.InFlight{}
			p := &Affinity{InFlight: inflight, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64}}
			if tc.running >= 0 {
				eng := engines{}
				for _, ep := range all {
					eng[ep] = fleet.EngineMetrics{Running: tc.running, At: time.Now().Add(-time.Hour)}
				}
				p.Engines = eng
			}
			start := func(n int) {
				for _, ep := range all {
					for range n {
						inflight.Start(ep)
					}
				}
			}
			start(tc.own)
			if _, err := p.Pick(snap, Input{Model: m, Request: request(t, "system", "user")}); err != nil {
				t.Fatal(err)
			}
			start(tc.since)
			d, err := p.Pick(snap, Input{Model: m, Request: request(t, "system", "user")})
			if err != nil {
				t.Fatal(err)
			}
			if d.Load != tc.want {
				t.Errorf("load %d, want %d", d.Load, tc.want)
			}
		})
	}
	least, err := (&LeastInFlight{InFlight: inFlight(map[string]int{"10.0.0.1:1": 2, "10.0.0.2:1": 2, "10.0.0.3:1": 2, "10.0.0.4:1": 2, "10.0.1.1:1": 2})}).Pick(snap, Input{Model: m})
	if err != nil || least.Load != 2 {
		t.Errorf("least in flight: load %d (%v), want 2", least.Load, err)
	}
}
