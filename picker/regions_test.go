package picker

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/policies"
)

// regionPolicy: one pool in each of three regions (us-east is the gateway's own), a managed API outside every
// region and one in eu-west, a tenant free to go anywhere and one pinned to eu-west.
const regionPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  routing: {debugScores: true, placement: PLACEMENT, maxWaiting: 4}
  regions:
  - {name: us-east, rtt: {us-west: 60ms, eu-west: 80ms}}
  - {name: us-west, rtt: {eu-west: 140ms}}
  - {name: eu-west}
  hardwareClasses:
    l40s: {costPerHour: 1.1, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  tiers:
    pro: {slo: {ttft: 500ms}}
    eu: {slo: {ttft: 500ms}, residency: [eu-west]}
  models:
  - name: m
    pools:
    - {name: east, hardwareClass: l40s, engine: vllm, maxConcurrency: 16, region: us-east, endpoints: ["10.0.0.1:1", "10.0.0.2:1"]}
    - {name: west, hardwareClass: l40s, engine: vllm, maxConcurrency: 16, region: us-west, endpoints: ["10.0.1.1:1", "10.0.1.2:1"]}
    - {name: eu, hardwareClass: l40s, engine: vllm, maxConcurrency: 16, region: eu-west, endpoints: ["10.0.2.1:1", "10.0.2.2:1"]}
    fallbacks:
    - {name: together, baseURL: "https://api.together.xyz/v1", model: provider-m, apiKeyFrom: "env:K", when: [unavailable, saturated]}
    - {name: eu-provider, baseURL: "https://eu.example.com/v1", model: provider-m, apiKeyFrom: "env:K", when: [unavailable, saturated], region: eu-west}
  tenants:
  - {name: acme, tier: pro, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
  - {name: eu-bank, tier: eu, apiKeys: ["sha256:bbb8fab5ab2c83254e4969c119cdbb68880ee066c42a36223f8ac83fff2d5b96"], models: ["*"]}
`

var regionEndpoints = map[string][]string{
	"east": {"10.0.0.1:1", "10.0.0.2:1"},
	"west": {"10.0.1.1:1", "10.0.1.2:1"},
	"eu":   {"10.0.2.1:1", "10.0.2.2:1"},
}

// regionEngines are the three pools' engines, idle and fresh, less those of the pools named down; busy pools'
// engines have a full queue (saturated).
func regionEngines(down, busy []string) engines {
	e := engines{}
	for pool, eps := range regionEndpoints {
		for _, ep := range eps {
			switch {
			case slices.Contains(down, pool):
			case slices.Contains(busy, pool):
				e[ep] = fleet.EngineMetrics{Running: 16, Waiting: 8}
			default:
				e[ep] = fleet.EngineMetrics{}
			}
		}
	}
	return e
}

func regionSnap(t *testing.T, placement string, edit func(string) string) (*policies.Snapshot, *policies.Model) {
	t.Helper()
	src := strings.Replace(regionPolicy, "PLACEMENT", placement, 1)
	if edit != nil {
		src = edit(src)
	}
	return modelOf(t, src)
}

// where names a decision's destination: a pool, "fallback/<name>", or the error.
func where(d Decision, err error) string {
	var nc *NoCapacity
	switch {
	case errors.As(err, &nc):
		return "no capacity"
	case err != nil:
		return err.Error()
	case d.Fallback != nil:
		return "fallback/" + d.Fallback.Name
	}
	return d.Pool.Name
}

// The chain: the gateway's own region, then the next by the policy's order, then the managed API, under either
// placement; a tenant pinned to a region never leaves it, not even for a managed API outside it.
func TestRegionsFailOverInOrderWithinResidency(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tenant     string
		down, busy []string
		edit       func(string) string
		want       string
	}{
		{"the local region first", "acme", nil, nil, nil, "east"},
		{"local down: the nearest other region", "acme", []string{"east"}, nil, nil, "west"},
		{"local saturated: the nearest other region", "acme", nil, []string{"east"}, nil, "west"},
		{"two down: the third", "acme", []string{"east", "west"}, nil, nil, "eu"},
		{"every region down: the managed API", "acme", []string{"east", "west", "eu"}, nil, nil, "fallback/together"},
		{"a failover order is the policy's", "acme", []string{"east"}, nil,
			func(s string) string {
				return strings.Replace(s, "{name: us-east, rtt:", "{name: us-east, failover: [eu-west, us-west], rtt:", 1)
			}, "eu"},
		{"a region left out of the order is never used", "acme", []string{"east", "west"}, nil,
			func(s string) string {
				return strings.Replace(s, "{name: us-east, rtt:", "{name: us-east, failover: [us-west], rtt:", 1)
			}, "fallback/together"},
		{"a pinned tenant stays in its region though the local one is healthy", "eu-bank", nil, nil, nil, "eu"},
		{"a pinned tenant's region down: a managed API inside it", "eu-bank", []string{"eu"}, nil, nil, "fallback/eu-provider"},
		{"a pinned tenant's region saturated: a managed API inside it", "eu-bank", nil, []string{"eu"}, nil, "fallback/eu-provider"},
		{"nothing inside the residency: refused, never served outside", "eu-bank", []string{"eu"}, nil,
			func(s string) string { return strings.Replace(s, ", region: eu-west}", "}", 1) }, "no capacity"},
	} {
		for _, placement := range []string{policies.PlacementSLO, policies.PlacementAffinity} {
			t.Run(placement+"/"+tc.name, func(t *testing.T) {
				snap, m := regionSnap(t, placement, tc.edit)
				tenant, _ := snap.Tenant(tc.tenant)
				p := newMixedPicker(regionEngines(tc.down, tc.busy))
				p.Region = "us-east"
				for i := range 6 {
					d, err := p.Pick(snap, Input{Tenant: tenant, Model: m, Request: request(t, "system "+string(rune('a'+i)), "q")})
					if got := where(d, err); got != tc.want {
						t.Fatalf("request %d went to %s, want %s", i, got, tc.want)
					}
				}
			})
		}
	}
}

// A request from another region's Envoy (its ext_proc failed over to this gateway) is placed as that region's
// gateway would place it: its region first, then its failover order; the gateway's own region is only where
// that order puts it.
func TestARequestIsPlacedFromTheEnvoysRegion(t *testing.T) {
	for _, tc := range []struct {
		name, from string
		down       []string
		want       string
	}{
		{"this gateway's own region", "", nil, "east"},
		{"from us-west: us-west first", "us-west", nil, "west"},
		{"from eu-west: eu-west first", "eu-west", nil, "eu"},
		{"from us-west, us-west down: its nearest, us-east (60 ms), before eu-west (140 ms)", "us-west", []string{"west"}, "east"},
		{"from eu-west, eu-west down: us-east (80 ms), not us-west (140 ms)", "eu-west", []string{"eu"}, "east"},
	} {
		for _, placement := range []string{policies.PlacementSLO, policies.PlacementAffinity} {
			t.Run(placement+"/"+tc.name, func(t *testing.T) {
				snap, m := regionSnap(t, placement, nil)
				tenant, _ := snap.Tenant("acme")
				p := newMixedPicker(regionEngines(tc.down, nil))
				p.Region = "us-east"
				for i := range 6 {
					d, err := p.Pick(snap, Input{Tenant: tenant, Model: m, Region: tc.from, Request: request(t, "system "+string(rune('a'+i)), "q")})
					if got := where(d, err); got != tc.want {
						t.Fatalf("request %d went to %s, want %s", i, got, tc.want)
					}
				}
			})
		}
	}
}

// The refusal of a pinned tenant names its residency, and the same policy still serves an unpinned tenant
// elsewhere.
func TestResidencyRefusalNamesTheRegions(t *testing.T) {
	snap, m := regionSnap(t, policies.PlacementAffinity, func(s string) string { return strings.Replace(s, ", region: eu-west}", "}", 1) })
	p := newMixedPicker(regionEngines([]string{"eu"}, nil))
	p.Region = "us-east"
	bank, _ := snap.Tenant("eu-bank")
	_, err := p.Pick(snap, Input{Tenant: bank, Model: m, Request: request(t, "sys", "q")})
	var nc *NoCapacity
	if !errors.As(err, &nc) || len(nc.Residency) != 1 || nc.Residency[0] != "eu-west" || !strings.Contains(err.Error(), "residency (eu-west)") {
		t.Fatalf("refusal %v: want one naming the residency eu-west", err)
	}
	acme, _ := snap.Tenant("acme")
	if d, err := p.Pick(snap, Input{Tenant: acme, Model: m, Request: request(t, "sys", "q")}); where(d, err) != "east" {
		t.Fatalf("the unpinned tenant went to %s", where(d, err))
	}
}

// Under SLO placement a remote region's prediction carries the round trip: a remote pool is taken when the
// local one is predicted late and it is in time, and its predicted TTFT includes the RTT.
func TestSLOPlacementAddsTheRoundTripToRemotePools(t *testing.T) {
	snap, m := regionSnap(t, policies.PlacementSLO, nil)
	acme, _ := snap.Tenant("acme")
	p := newMixedPicker(regionEngines(nil, nil))
	p.Region = "us-east"
	d, err := p.Pick(snap, Input{Tenant: acme, Model: m, Request: request(t, "sys", "q")})
	if where(d, err) != "east" {
		t.Fatalf("idle fleet: went to %s", where(d, err))
	}
	local := d.Predicted.TTFT
	byPool := map[string]time.Duration{}
	for _, s := range d.Scores {
		for pool, eps := range regionEndpoints {
			if slices.Contains(eps, s.Endpoint) {
				byPool[pool] = s.TTFT
			}
		}
	}
	if got := byPool["west"] - byPool["east"]; got != 60*time.Millisecond {
		t.Errorf("us-west's predicted TTFT is %v above us-east's, want the 60ms round trip", got)
	}
	if got := byPool["eu"] - byPool["east"]; got != 80*time.Millisecond {
		t.Errorf("eu-west's predicted TTFT is %v above us-east's, want the 80ms round trip", got)
	}
	// The local batches are full with requests waiting: seconds late. us-west is in time at +60 ms.
	late := regionEngines(nil, nil)
	for _, ep := range regionEndpoints["east"] {
		late[ep] = fleet.EngineMetrics{Running: 16, Waiting: 3}
	}
	p = newMixedPicker(late)
	p.Region = "us-east"
	d, err = p.Pick(snap, Input{Tenant: acme, Model: m, Request: request(t, "sys", "q")})
	if where(d, err) != "west" {
		t.Fatalf("local late: went to %s, want us-west, the nearest in time", where(d, err))
	}
	if d.Predicted.TTFT < local+60*time.Millisecond-time.Millisecond {
		t.Errorf("us-west predicted %v: the round trip is missing (local idle %v)", d.Predicted.TTFT, local)
	}
}

// A region that was down is preferred again only once it has stayed up for the failback: a flicker restarts
// the wait, so its traffic does not flap.
func TestARecoveredRegionWinsBackAfterTheFailback(t *testing.T) {
	snap, m := regionSnap(t, policies.PlacementAffinity, func(s string) string {
		return strings.Replace(s, "maxWaiting: 4}", "maxWaiting: 4, regionFailback: 10s}", 1)
	})
	acme, _ := snap.Tenant("acme")
	now := time.Unix(1000, 0)
	p := newMixedPicker(nil)
	p.Region, p.Now = "us-east", func() time.Time { return now }
	pick := func(step string, down []string, want string) {
		t.Helper()
		p.Engines = regionEngines(down, nil)
		d, err := p.Pick(snap, Input{Tenant: acme, Model: m, Request: request(t, "sys", step)})
		if got := where(d, err); got != want {
			t.Fatalf("%s: went to %s, want %s", step, got, want)
		}
	}
	pick("healthy", nil, "east")
	pick("down", []string{"east"}, "west")
	pick("up again", nil, "west")
	now = now.Add(9 * time.Second)
	pick("up for 9s", nil, "west")
	pick("flickers down", []string{"east"}, "west")
	now = now.Add(time.Second)
	pick("up again after the flicker", nil, "west")
	now = now.Add(9 * time.Second)
	pick("9s after the flicker", nil, "west")
	pick("held back but the others down", []string{"west", "eu"}, "east")
	now = now.Add(time.Second)
	pick("10s after the flicker", nil, "east")
	pick("and it stays", nil, "east")
}

// A remote region's round trip stays out of its endpoints' own TTFT model: what it learns from a measured TTFT
// is the engine's part.
func TestRoundTripStaysOutOfTheEngineModel(t *testing.T) {
	pd := Prediction{TTFT: 140 * time.Millisecond, idle: 100 * time.Millisecond, rtt: 80 * time.Millisecond}
	engine, ttft := pd.atEngine(200 * time.Millisecond)
	if engine.TTFT != 60*time.Millisecond || engine.idle != 20*time.Millisecond || ttft != 120*time.Millisecond {
		t.Fatalf("at the engine: predicted %v (idle %v), measured %v; want 60ms, 20ms, 120ms", engine.TTFT, engine.idle, ttft)
	}
	if _, ttft := pd.atEngine(50 * time.Millisecond); ttft != 0 {
		t.Fatalf("a measurement below the round trip gave %v, want 0", ttft)
	}
}
