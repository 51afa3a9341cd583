package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"
)

// class is one tier's traffic: its share of the load and its TTFT target (simulated time).
type class struct {
	tier, key string
	share     float64
	ttft      time.Duration
}

// classes are the three tiers, highest priority first.
var classes = []class{
	{"enterprise", "sk-bench-enterprise", 0.2, 500 * time.Millisecond},
	{"pro", "sk-bench-pro", 0.3, time.Second},
	{"free", "sk-bench-free", 0.5, 2 * time.Second},
}

// everyoneKey is the one tenant of the plain FIFO variant: one queue in arrival order.
const everyoneKey = "sk-bench-everyone"

// variant is one configuration under test.
type variant struct {
	name     string
	load     float64 // × capacity
	replicas int
	// mode: "default" (no admission queue, the routing defaults), "fifo" (a queue of the same size without
	// priorities or deadlines), "admission" (tiers, deadlines, degradation, headroom, reserve).
	mode         string
	singleTenant bool
	// starved: each gateway held to a fraction of one core beside a busy loop, the engines at half speed
	// (starved.go).
	starved bool
}

var (
	variantCalibration = variant{name: "calibration", mode: "default"}
	variantBaseline    = variant{name: "1× capacity, admission", load: 1, mode: "admission"}
	variantDefault     = variant{name: "3×, today's default (shed at 64 waiting)", load: 3, mode: "default"}
	variantFIFO        = variant{name: "3×, plain FIFO queue of the same size", load: 3, mode: "fifo", singleTenant: true}
	variantAdmission   = variant{name: "3×, admission", load: 3, mode: "admission"}
	variantTwo         = variant{name: "3×, admission, two gateway replicas", load: 3, mode: "admission", replicas: 2}
	variantStarved     = variant{name: "3×, admission, starved gateway", load: 3, mode: "admission", starved: true}
	variantStarvedTwo  = variant{name: "3×, admission, two starved gateway replicas", load: 3, mode: "admission", replicas: 2, starved: true}
	variants           = []variant{variantBaseline, variantDefault, variantFIFO, variantAdmission, variantTwo, variantStarved, variantStarvedTwo}
)

// selected says whether -only picks v: its name is -only, or contains it when no variant's name is -only.
func (v variant) selected(only string) bool {
	if slices.ContainsFunc(variants, func(o variant) bool { return o.name == only }) {
		return v.name == only
	}
	return only == "" || strings.Contains(v.name, only)
}

// maxWaiting is the engine queue at which the queueing variants hold requests in the gateway.
var (
	maxWaiting   = flag.Int("max-waiting", 1, "routing.maxWaiting of the queueing variants")
	proHeadroom  = flag.Float64("pro-headroom", 0.65, "the pro tier's headroom")
	freeHeadroom = flag.Float64("free-headroom", 0.5, "the free tier's headroom")
	entReserve   = flag.Float64("enterprise-reserve", 0.5, "the enterprise tier's reserve of the large model (0: none)")
)

// queueLength is the admission queue's bound in both queueing variants.
const queueLength = 256

// policy is the variant's policy file over the fleet at addrs, its targets scaled to real time.
func (v variant) policy(addrs map[string]string, timeScale float64) string {
	scaled := func(d time.Duration) string { return time.Duration(float64(d) * timeScale).String() }
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  gateway: {defaultMaxTokens: %d}
`, maxTokens)
	switch v.mode {
	case "admission":
		fmt.Fprintf(&b, "  routing: {maxWaiting: %d}\n  admission: {maxQueueLength: %d}\n", *maxWaiting, queueLength)
		// As docs/admission.md asks of several replicas: each counts its own sends since an engine reading
		// this many times, since the others fill the same engines alike.
		fmt.Fprintf(&b, "  quotas: {gatewayReplicas: %d}\n", max(1, v.replicas))
	case "fifo":
		fmt.Fprintf(&b, "  routing: {maxWaiting: %d}\n  admission: {maxQueueLength: %d, maxQueueWait: 1h}\n", *maxWaiting, queueLength)
	}
	b.WriteString(`  hardwareClasses:
    h200: {costPerHour: 3.50, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    l40s: {costPerHour: 1.10, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  tiers:
`)
	for i, c := range classes {
		fmt.Fprintf(&b, "    %s:\n", c.tier)
		// Calibration measures the fleet, so it sets no TTFT target: with one, SLO placement refuses the closed
		// loop's requests it predicts late, learns from those it lets through that the pool is slower still,
		// and a reading after the first fell to 17, 11, even 0 requests/s.
		if v.mode != "fifo" && v != variantCalibration {
			fmt.Fprintf(&b, "      slo: {ttft: %s}\n", scaled(c.ttft))
		}
		if v.mode == "admission" {
			fmt.Fprintf(&b, "      priority: %d\n", 10*(len(classes)-1-i))
			switch c.tier {
			case "enterprise":
				if *entReserve > 0 {
					fmt.Fprintf(&b, "      reserve: {big: %v}\n", *entReserve)
				}
			case "pro":
				fmt.Fprintf(&b, "      degradeTo: [{model: big, to: small}]\n      headroom: %v\n", *proHeadroom)
			case "free":
				fmt.Fprintf(&b, "      headroom: %v\n", *freeHeadroom)
			}
		}
	}
	fmt.Fprintf(&b, `  models:
  - name: big
    pools:
    - {name: big-h200, hardwareClass: h200, engine: vllm, servedModel: big-served, maxConcurrency: %d, endpoints: [%q, %q]}
  - name: small
    pools:
    - {name: small-l40s, hardwareClass: l40s, engine: vllm, servedModel: small-served, maxConcurrency: %d, endpoints: [%q]}
  tenants:
`, batch, addrs["big-0"], addrs["big-1"], 2*batch, addrs["small-0"])
	for _, c := range classes {
		fmt.Fprintf(&b, "  - {name: %s, tier: %s, apiKeys: [%q], models: [\"*\"]}\n", c.tier, c.tier, keyHash(c.key))
	}
	fmt.Fprintf(&b, "  - {name: everyone, tier: pro, apiKeys: [%q], models: [\"*\"]}\n", keyHash(everyoneKey))
	return b.String()
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}
