package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
)

// The P/D bench's rows (make bench-pd, issue #38): the same fleet serving everything whole, splitting every
// request at a fixed ratio (the H200s prefill, the L40S pairs decode), and infergate's per-request choice (the
// H200s do both, the L40S pairs decode; a request is split when its uncached prompt reaches the policy's
// minUncachedTokens, the default, and splitting pays), and the same choice on the fixed ratio's roles and
// threshold (the H200s only prefill; every request may be split, and is when it pays: the L40S pairs serve the
// others whole), where SLO placement predicts the prefill legs of a pool that takes no whole request.
const (
	rowAggregated        = "aggregated"
	rowDisaggregated     = "disaggregated 1:2"
	rowPerRequest        = "per-request"
	rowPerRequestPrefill = "per-request, H200s prefill only"
	// rowAggregatedAA is aggregated serving again on the same fleet, its endpoints named otherwise: the same
	// policy, so what it serves in time differs from aggregated's by chance alone — ties broken on the
	// endpoints' names, whose consequences a fleet past its capacity carries through the run. Its shortfalls
	// against aggregated are how often the bench's judgement of a shortfall (shortfalls) calls chance real.
	rowAggregatedAA = "aggregated A/A"
)

var pdRows = []string{rowAggregated, rowDisaggregated, rowPerRequest, rowPerRequestPrefill}

// pdScenario is the P/D bench's fleet and workload: a 70B model on H200s (compute-strong) and L40S pairs
// (cheaper, slower to prefill), shared-prefix chat at a swept rate, and bursts of 8-32K-token prompts.
type pdScenario struct {
	placement       string        // routing.placement of every row: slo or affinity
	chatRate        float64       // chat requests a second
	longTTFT        time.Duration // a long prompt's TTFT target (chat's is scenario.ttft)
	burstEvery      time.Duration
	burstWindow     time.Duration // chat arriving this long after a burst starts is "during the burst"
	kvBytesPerToken int64
	transferGbps    float64
}

// pdFleet is one fleet of the P/D bench: its H200s, its L40S pairs and the link between the two pools.
type pdFleet struct {
	h200, l40s int
	gbps       float64
}

// pdBase is the fleet of the bench's main tables: two H200s, four L40S pairs, 100 Gb/s.
var pdBase = pdFleet{h200: 2, l40s: 4, gbps: 100}

func (f pdFleet) String() string {
	return fmt.Sprintf("%d H200, %d L40S pairs, %g Gb/s", f.h200, f.l40s, f.gbps)
}

// pdFamily draws n fleets other than the base from seed (at most every one there is): 1-4 H200s, 2-6 L40S
// pairs, and a link of 10-200 Gb/s (TCP to RDMA). The per-request choice must hold on fleets it was not tuned
// on, and the prefill and decode capacity's ratio is what decides whether splitting pays.
func pdFamily(n int, seed uint64) []pdFleet {
	rng := rand.New(rand.NewPCG(0x38f, seed))
	links := []float64{10, 25, 40, 50, 100, 200}
	n = min(n, 4*5*len(links)-1)
	seen := map[pdFleet]bool{pdBase: true}
	var out []pdFleet
	for len(out) < n {
		f := pdFleet{h200: 1 + rng.IntN(4), l40s: 2 + rng.IntN(5), gbps: links[rng.IntN(len(links))]}
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// newPDScenario is the bench's scenario on fleet f at one chat rate, every row under one placement.
func newPDScenario(f pdFleet, chatRate float64, placement string) *scenario {
	h200, l40s := fleetsim.Profiles["h200"], fleetsim.Profiles["l40s"]
	return &scenario{id: int(chatRate), model: "llama-70b", sizeB: 70, seed: 38,
		classes: []class{
			{name: "h200", price: 3.5, speed: h200, maxNumSeqs: 128, numGPUBlocks: 24000, replicas: f.h200},
			{name: "l40s-x2", price: 2.2, speed: l40s, maxNumSeqs: 128, numGPUBlocks: 10000, replicas: f.l40s},
		},
		ttft: time.Second, tpot: 80 * time.Millisecond,
		pd: &pdScenario{placement: placement, chatRate: chatRate, longTTFT: 6 * time.Second, burstEvery: 15 * time.Second, burstWindow: 10 * time.Second,
			kvBytesPerToken: 163840, transferGbps: f.gbps}}
}

// policyYAML is the row's policy: the two pools with their roles, and disaggregation where the row splits.
func (p *pdScenario) policyYAML(endpoints [][]string, row string) string {
	roles := map[string][2]string{rowAggregated: {"both", "both"}, rowDisaggregated: {"prefill", "decode"}, rowPerRequest: {"both", "decode"},
		rowPerRequestPrefill: {"prefill", "decode"}, rowAggregatedAA: {"both", "both"}}[row]
	var b strings.Builder
	b.WriteString("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec:\n  gateway: {maxEndpointsPerDecision: 1}\n")
	fmt.Fprintf(&b, "  routing: {placement: %s, maxWaiting: 8}\n  hardwareClasses:\n", p.placement)
	b.WriteString("    h200: {costPerHour: 3.5, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}\n")
	b.WriteString("    l40s-x2: {gpu: l40s, gpusPerReplica: 2, costPerHour: 2.2, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}\n")
	b.WriteString("  tiers:\n    interactive:\n      slo: {ttft: 1s, tpot: 80ms}\n")
	b.WriteString("  models:\n  - name: llama-70b\n    contextTokens: 40000\n    pools:\n")
	for i, name := range []string{"h200", "l40s-x2"} {
		fmt.Fprintf(&b, "    - {name: %s, hardwareClass: %s, engine: vllm, maxConcurrency: 128, role: %s, endpoints: [%q", name, name, roles[i], endpoints[i][0])
		for _, e := range endpoints[i][1:] {
			fmt.Fprintf(&b, ", %q", e)
		}
		b.WriteString("]}\n")
	}
	switch row {
	case rowDisaggregated:
		fmt.Fprintf(&b, "    disaggregation: {protocol: llm-d, split: threshold, minUncachedTokens: 1, kvBytesPerToken: %d, transferGbps: %g}\n", p.kvBytesPerToken, p.transferGbps)
	case rowPerRequestPrefill:
		fmt.Fprintf(&b, "    disaggregation: {protocol: llm-d, minUncachedTokens: 1, kvBytesPerToken: %d, transferGbps: %g}\n", p.kvBytesPerToken, p.transferGbps)
	case rowPerRequest:
		fmt.Fprintf(&b, "    disaggregation: {protocol: llm-d, kvBytesPerToken: %d, transferGbps: %g}\n", p.kvBytesPerToken, p.transferGbps)
	}
	fmt.Fprintf(&b, "  tenants:\n  - {name: t, tier: interactive, apiKeys: [%q], models: [\"*\"]}\n", apiKeyHash)
	return b.String()
}

// workload draws the arrivals: chat at chatRate (Poisson), 80 % of it opening with one of eight active groups'
// 1,000-token prefixes (each group lives about 20 requests), 100-400 tokens of its own (unshared chat: 500-1,500
// tokens), 100-300 output tokens; and every burstEvery, from 5 s, a burst of 2-5 prompts of 8-32K tokens within
// 2 s, 100-300 output tokens each.
func (p *pdScenario) workload(d time.Duration, arrivalSeed uint64) []request {
	rng := rand.New(rand.NewPCG(0x38, arrivalSeed))
	// Tokens of about four bytes, as English text has: the picker estimates a prompt's tokens from its bytes.
	var counter int
	words := func(_ string, n int) []string {
		out := make([]string, n)
		for i := range out {
			counter++
			out[i] = strconv.FormatInt(int64(counter), 36)
		}
		return out
	}
	var groups []*group
	next := 0
	newGroup := func() *group {
		g := &group{id: next, prefix: words(fmt.Sprintf("g%d-%d-", arrivalSeed, next), 1000), left: 10 + rng.IntN(21)}
		next++
		return g
	}
	for range 8 {
		groups = append(groups, newGroup())
	}
	var out []request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / p.chatRate * float64(time.Second))
		if t >= d {
			break
		}
		tag := fmt.Sprintf("c%d-%d-", arrivalSeed, len(out))
		r := request{at: t, output: 100 + rng.IntN(201), group: -1}
		if rng.Float64() < 0.8 {
			i := rng.IntN(len(groups))
			g := groups[i]
			r.group, r.system, r.user = g.id, g.prefix, words(tag, 100+rng.IntN(301))
			if g.left--; g.left <= 0 {
				groups[i] = newGroup()
			}
		} else {
			n := 500 + rng.IntN(1001)
			r.system, r.user = words(tag+"s", n/3), words(tag+"u", n-n/3)
		}
		out = append(out, r)
	}
	for start := 5 * time.Second; start < d; start += p.burstEvery {
		for k := range 2 + rng.IntN(4) {
			tag := fmt.Sprintf("l%d-%d-%d-", arrivalSeed, start/time.Second, k)
			n := 8000 + rng.IntN(24001)
			out = append(out, request{at: start + time.Duration(rng.Float64()*2*float64(time.Second)), output: 100 + rng.IntN(201),
				group: -1, long: true, system: words(tag+"s", 200), user: words(tag+"u", n-200)})
		}
	}
	return out
}

// duringBurst says whether a chat request arriving at t arrives during a burst.
func (p *pdScenario) duringBurst(t time.Duration) bool {
	return t >= 5*time.Second && (t-5*time.Second)%p.burstEvery < p.burstWindow
}

// split runs a request split between its prefiller and addr as llm-d's sidecar does (fleetsim/disagg.go): the
// prefill leg on the prefiller (one output token), the prompt's KV cache moved over the link
// (kvBytesPerToken × the tokens the prefiller computed ÷ transferGbps), then the decode leg on addr, whose
// prefill is then a cache hit. TTFT runs from the arrival to the decode leg's first token; the cached tokens
// reported are the prefill leg's, as llm-d's sidecar rewrites them.
func (g *gateway) split(i int, r *request, addr string, dec picker.Decision, tokens []string, sent time.Time) {
	arrived := epoch.Add(r.at)
	done := func() { g.rep(i).inflight.Done(dec.Target(g.sc.model)) }
	g.fleet.submit(dec.Prefill, tokens, 1, func() {}, func(pq *fleetsim.Sequence, err error) {
		if err != nil {
			done()
			return
		}
		pd := g.sc.pd
		computed := pq.Prompt() - pq.Cached()
		transfer := time.Duration(float64(computed) * float64(pd.kvBytesPerToken) * 8 / (pd.transferGbps * 1e9) * float64(time.Second))
		prefillCached := pq.Cached()
		g.sim.after(transfer, func() {
			g.fleet.byAddr[addr].eng.ImportKV(tokens)
			g.fleet.submit(addr, tokens, r.output, func() { g.rep(i).picker.Prefilled(dec) }, func(q *fleetsim.Sequence, err error) {
				done()
				if err != nil {
					return
				}
				o := outcome{served: true, split: true, long: r.long, arrived: r.at, ttft: q.FirstToken().Sub(arrived),
					completion: q.Output(), prompt: q.Prompt(), cached: prefillCached, class: g.classOf[addr]}
				if q.Output() > 1 {
					o.tpot = q.Finished().Sub(q.FirstToken()) / time.Duration(q.Output()-1)
				}
				o.good = o.ttft <= g.sc.ttftFor(r) && o.tpot <= g.sc.tpot
				g.out[i] = o
				g.rep(i).picker.Observe(dec, openai.Usage{PromptTokens: int64(o.prompt), CachedTokens: int64(o.cached), CachedReported: true})
				g.rep(i).picker.ObserveTiming(g.sc.model, dec, q.FirstToken().Sub(sent), o.tpot)
			})
		})
	})
}
