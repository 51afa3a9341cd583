package picker

import (
	"math"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker/scorers"
	"github.com/infergate/infergate/policies"
)

// mixedPolicy: one model on a fast-prefill, dearer H200 pool and a slower, cheaper L40S pool, a LoRA adapter,
// and tenants of two tiers.
const mixedPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {debugScores: true}
  hardwareClasses:
    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    l40s: {costPerHour: 1.1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  tiers:
    pro: {}
    free: {hardwareClasses: [l40s]}
  models:
  - name: m
    adapters: [m-sql]
    pools:
    - {name: fast, hardwareClass: h200, engine: vllm, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}
    - {name: cheap, hardwareClass: l40s, engine: vllm, endpoints: ["10.0.1.1:1", "10.0.1.2:1"]}
    fallbacks:
    - {name: together, baseURL: "https://api.together.xyz/v1", model: provider-m, apiKeyFrom: "env:K", when: [saturated]}
  tenants:
  - {name: pro, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
  - {name: free, tier: free, apiKeys: ["sha256:bbb8fab5ab2c83254e4969c119cdbb68880ee066c42a36223f8ac83fff2d5b96"], models: ["*"]}
`

func mixed(t *testing.T) (*policies.Snapshot, *policies.Model) { return modelOf(t, mixedPolicy) }

func newMixedPicker(eng engines) *Affinity {
	return &Affinity{InFlight: &fleet.InFlight{}, Index: NewIndex(), Hasher: Hasher{BlockBytes: 64, MaxBlocks: 4096}, Engines: eng}
}

func idleEngines(mod func(ep string, m *fleet.EngineMetrics)) engines {
	e := engines{}
	for _, ep := range []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.1.1:1", "10.0.1.2:1"} {
		m := fleet.EngineMetrics{}
		if mod != nil {
			mod(ep, &m)
		}
		e[ep] = m
	}
	return e
}

func TestHardwareClassAndCost(t *testing.T) {
	snap, m := mixed(t)
	pro, _ := snap.TenantForKey("sk-demo-acme")
	free, _ := snap.TenantForKey("sk-demo-globex")
	long := strings.Repeat("A long document the model must read before it answers. ", 1500) // ≈ 21K tokens
	for _, tc := range []struct {
		name     string
		tenant   *policies.Tenant
		system   string
		wantPool string
	}{
		{"a long uncached prompt prefers the fast-prefill class", pro, long, "fast"},
		{"a tiny prompt is a tie on prefill: the cheaper class wins", pro, "hi", "cheap"},
		{"the free tier never gets the H200s, however long the prompt", free, long, "cheap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newMixedPicker(idleEngines(nil))
			d, err := p.Pick(snap, Input{Tenant: tc.tenant, Model: m, Request: &openai.Request{Prompt: chatPrompt(t, tc.system, "?"), BodyBytes: len(tc.system)}})
			if err != nil {
				t.Fatal(err)
			}
			if d.Pool.Name != tc.wantPool {
				t.Errorf("chose pool %s (%v), want %s; scores %+v", d.Pool.Name, d.Endpoints, tc.wantPool, d.Scores)
			}
		})
	}
	if snap.Allows(free, m) != true {
		t.Error("the free tier may use m on its L40S pool")
	}
}

func TestLoRAAdapterPreference(t *testing.T) {
	snap, m := mixed(t)
	eng := idleEngines(func(ep string, e *fleet.EngineMetrics) {
		if ep == "10.0.1.2:1" {
			e.LoRAs = []string{"m-sql"}
		}
	})
	p := newMixedPicker(eng)
	d, err := p.Pick(snap, Input{Model: m, Adapter: "m-sql", Request: request(t, "You write SQL.", "list users")})
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoints[0] != "10.0.1.2:1" || d.Served() != "m-sql" {
		t.Errorf("chose %v serving %q, want the endpoint with m-sql loaded", d.Endpoints, d.Served())
	}
	// Saturated everywhere: an adapter request never overflows to the provider, which lacks the adapter.
	busy := newMixedPicker(idleEngines(func(_ string, e *fleet.EngineMetrics) { e.Waiting = 1000 }))
	if _, err := busy.Pick(snap, Input{Model: m, Adapter: "m-sql", Request: request(t, "s", "u")}); err == nil {
		t.Error("adapter request overflowed to the managed fallback")
	}
	if d, err := busy.Pick(snap, Input{Model: m, Request: request(t, "s", "u")}); err != nil || d.Fallback == nil {
		t.Errorf("base-model request did not overflow: %+v %v", d, err)
	}
}

func TestDebugScores(t *testing.T) {
	snap, m := mixed(t)
	p := newMixedPicker(idleEngines(nil))
	d, err := p.Pick(snap, Input{Model: m, Request: request(t, "system prompt", "question")})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Scores) != 4 || d.Scores[0].Endpoint != d.Endpoints[0] {
		t.Fatalf("scores %+v for decision %v", d.Scores, d.Endpoints)
	}
	for _, s := range d.Scores {
		if s.Total <= 0 || s.Part("load") != 1 || s.Part("prefill") <= 0 || s.Part("prefill") > 1 || len(s.Parts) != len(scorers.Default) {
			t.Errorf("score %+v", s)
		}
	}
}

// A KV cache over the threshold turns away prompts it does not hold, but still takes those it does.
func TestKVFullServesItsOwnPrefixes(t *testing.T) {
	snap, m := mixed(t)
	eng := idleEngines(func(ep string, e *fleet.EngineMetrics) { e.KVUtil, e.Waiting = 0.99, 1 })
	p := newMixedPicker(eng)
	sys := strings.Repeat("Shared group instructions. ", 40)
	p.Index.Credit("10.0.0.2:1", p.Hasher.Hash(nil, Seed("m", ""), chatPrompt(t, sys, "q")), 0)
	d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, "another q")})
	if err != nil || d.Endpoints[0] != "10.0.0.2:1" {
		t.Fatalf("cached prefix on a full endpoint: %+v %v", d, err)
	}
	d, err = p.Pick(snap, Input{Model: m, Request: request(t, "a new prompt nobody holds", "q")})
	if err != nil || d.Fallback == nil {
		t.Errorf("a new prompt with every KV cache full should overflow, got %+v %v", d, err)
	}
}

func TestObserveCalibratesAndForgets(t *testing.T) {
	snap, m := mixed(t)
	p := newMixedPicker(idleEngines(func(_ string, e *fleet.EngineMetrics) { e.NumBlocks, e.BlockSize = 1000, 16 }))
	sys := strings.Repeat("Group rules, to be cached. ", 60)
	d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, "q1")})
	if err != nil {
		t.Fatal(err)
	}
	ep := d.Endpoints[0]
	// The engine counts 2.5× fewer tokens than bytes ÷ 4: the index grows to hold as much text as the cache.
	for range 200 {
		p.Observe(Decision{EstimatedPromptTokens: 250}, openai.Usage{PromptTokens: 100})
	}
	if s := p.tokenScale(); math.Abs(s-2.5) > 0.01 {
		t.Errorf("scale %v, want 2.5", s)
	}
	d2, _ := p.Pick(snap, Input{Model: m, Request: request(t, sys, "q2")})
	if d2.Endpoints[0] != ep || d2.ExpectedCachedTokens == 0 {
		t.Fatalf("second request of the group: %v, expected cached %d", d2.Endpoints, d2.ExpectedCachedTokens)
	}
	if got := p.Index.Capacity(ep); got != 2500 {
		t.Errorf("index capacity %d blocks, want 1000 × 2.5", got)
	}
	// The engine served nothing from cache: the index forgets the group there.
	p.Observe(d2, openai.Usage{PromptTokens: 500, CachedTokens: 0, CachedReported: true})
	if n := p.Index.Match(ep, p.Hasher.Hash(nil, Seed("m", ""), chatPrompt(t, sys, "q3"))); n != 0 {
		t.Errorf("still believes %d blocks are cached after the engine reported a miss", n)
	}
	// An engine that does not report cached tokens contradicts nothing.
	d3, _ := p.Pick(snap, Input{Model: m, Request: request(t, sys, "q4")})
	d4, _ := p.Pick(snap, Input{Model: m, Request: request(t, sys, "q5")})
	p.Observe(d4, openai.Usage{PromptTokens: 500})
	if n := p.Index.Match(d3.Endpoints[0], p.Hasher.Hash(nil, Seed("m", ""), chatPrompt(t, sys, "q6"))); n == 0 {
		t.Error("forgot a prefix on a zero that was never reported")
	}
}

func TestIndexResizeRetainForget(t *testing.T) {
	x := NewIndex()
	x.Credit("a", []uint64{1, 2, 3, 4}, 4)
	x.Credit("b", []uint64{1}, 4)
	x.Credit("a", []uint64{5}, 2) // shrinks to the two most recent: 5, and 1 (a prompt's head is its last use)
	if x.Capacity("a") != 2 || x.Match("a", []uint64{5}) != 1 || x.Match("a", []uint64{1}) != 1 || x.Match("a", []uint64{4}) != 0 {
		t.Errorf("resize kept the wrong blocks")
	}
	x.Credit("a", []uint64{6, 7}, 8) // grows, keeping what it had
	if x.Match("a", []uint64{5}) != 1 || x.Match("a", []uint64{6, 7}) != 2 {
		t.Errorf("grow lost blocks")
	}
	x.Forget("a", 6)
	if x.Match("a", []uint64{6, 7}) != 0 || x.Match("a", []uint64{7}) != 1 {
		t.Errorf("forget removed the wrong block")
	}
	x.Retain(func(ep string) bool { return ep == "a" })
	if x.Capacity("b") != 0 || x.Capacity("a") == 0 {
		t.Error("Retain kept a removed endpoint or dropped a live one")
	}
	for i := range uint64(20) { // slots freed by Forget are reused without corrupting the list
		x.Credit("a", []uint64{100 + i}, 8)
	}
	if x.Match("a", []uint64{119}) != 1 || x.Match("a", []uint64{100}) != 0 {
		t.Error("LRU order broken after forget and reuse")
	}
}

func TestPolicyChangedForgetsRemovedEndpoints(t *testing.T) {
	snap, _ := mixed(t)
	p := newMixedPicker(nil)
	p.Index.Credit("10.0.0.1:1", []uint64{1}, 0)
	p.Index.Credit("10.9.9.9:1", []uint64{1}, 0)
	p.PolicyChanged(snap)
	if p.Index.Capacity("10.9.9.9:1") != 0 || p.Index.Capacity("10.0.0.1:1") == 0 {
		t.Error("PolicyChanged kept a removed endpoint or dropped a listed one")
	}
}

// A request Envoy retried on another endpoint never reached the chosen one: the index stops believing the
// chosen endpoint holds the prompt.
func TestObserveForgetsWhenServedElsewhere(t *testing.T) {
	snap, m := mixed(t)
	p := newMixedPicker(idleEngines(func(_ string, e *fleet.EngineMetrics) { e.NumBlocks, e.BlockSize = 1000, 16 }))
	sys := strings.Repeat("Group rules, to be cached. ", 60)
	d, err := p.Pick(snap, Input{Model: m, Request: request(t, sys, "q1")})
	if err != nil || len(d.Endpoints) < 2 {
		t.Fatalf("%+v %v", d, err)
	}
	chosen := d.Endpoints[0]
	probe := p.Hasher.Hash(nil, Seed("m", ""), chatPrompt(t, sys, "q2"))
	if p.Index.Match(chosen, probe) == 0 {
		t.Fatal("the pick did not credit the chosen endpoint")
	}
	d.ServedBy = d.Endpoints[1]
	p.Observe(d, openai.Usage{PromptTokens: 500})
	if n := p.Index.Match(chosen, probe); n != 0 {
		t.Errorf("still believes %s holds %d blocks of a prompt Envoy served on %s", chosen, n, d.ServedBy)
	}
}

// The capacity asked of the index wobbles with the learnt token ratio on every response: the LRU is resized
// (a copy of all of it) only when it moves by more than 1/32, and a resize keeps what the LRU had aged out and
// remembers the groups it leaves out as aged out.
func TestIndexResizeOnlyOnRealChangesKeepsAgedOut(t *testing.T) {
	x := NewIndex()
	x.Credit("a", []uint64{1}, 320)
	for _, c := range []struct {
		asked, want int
	}{{330, 320}, {310, 320}, {331, 331}, {322, 331}, {310, 310}, {4, 4}, {5, 5}} {
		x.Credit("a", []uint64{1}, c.asked)
		if got := x.Capacity("a"); got != c.want {
			t.Errorf("asked %d: capacity %d, want %d", c.asked, got, c.want)
		}
	}

	x = NewIndex()
	x.Credit("a", []uint64{1}, 64) // a one-block prompt: its block names its group
	x.Churn("a", 64)               // another replica's traffic ages it out
	for _, g := range []uint64{2, 3, 4} {
		x.Credit("a", []uint64{g}, 64)
	}
	if !x.AgedOut("a", 1) {
		t.Fatal("group 1 not aged out before the resize")
	}
	x.Credit("a", []uint64{4}, 2) // shrinks to 4 and 3, leaving group 2 out
	for g, want := range map[uint64]bool{1: true, 2: true, 3: false, 4: false} {
		if got := x.AgedOut("a", g); got != want {
			t.Errorf("after the resize, group %d aged out: %v, want %v", g, got, want)
		}
	}
}
