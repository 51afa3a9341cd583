package picker

import (
	"sync"
	"time"

	"github.com/infergate/infergate/policies"
)

// Regions (policies spec.regions, docs/regions.md). A gateway in a region takes the regions in the order
// policies.Snapshot.RegionOrder gives: its own, then its failover regions. Each candidate carries its region's
// place in that order (scored.region) and the round trip to it (scored.rtt).
//
// Without an SLO, a request is placed by score among the candidates of the nearest region that has one the
// load bound keeps, each region bounded by its own mean: a remote region is used when the nearer ones are down,
// saturated or full, never to even out load. Under SLO placement the RTT is added to a remote candidate's
// predicted TTFT; among the candidates predicted in time the nearest region's are taken first (then the
// cheapest), and when none is in time the fastest, RTT included, go first: a remote pool wins only when the
// local ones cannot meet the target and it can, or when it really is faster.
//
// A region found down (candidates, none with fresh metrics) is held back once it is up again: it ranks behind
// every other until it has stayed up for the policy's regionFailback, so that a region whose health flickers
// does not pull its traffic back and forth.

// maxRegions bounds the regions one decision counts on the stack; validation allows no more.
const maxRegions = policies.MaxRegions

// regionHealth remembers, per model and region, a region found down and when it came back up.
type regionHealth struct {
	states sync.Map // regionKey → regionState
}

type regionKey struct{ model, region string }

// regionState is a region found down: upSince is when it was first seen up again (zero while down).
type regionState struct{ upSince time.Time }

// held records whether a region of a model had an endpoint with fresh metrics and says whether it is held back:
// found down before, and up again for less than failback.
func (h *regionHealth) held(key regionKey, up bool, now time.Time, failback time.Duration) bool {
	v, known := h.states.Load(key)
	switch {
	case !up:
		if !known || !v.(regionState).upSince.IsZero() {
			h.states.Store(key, regionState{})
		}
		return false
	case !known:
		return false
	}
	st := v.(regionState)
	switch {
	case st.upSince.IsZero():
		h.states.Store(key, regionState{upSince: now})
		return failback > 0
	case now.Sub(st.upSince) >= failback:
		h.states.Delete(key)
		return false
	}
	return true
}

// regionCounts are, per place in the region order, the candidates' endpoints seen and those with fresh metrics.
type regionCounts struct {
	seen, up [maxRegions]int
}

// regionOf is a pool's place in the gateway's region order, and false when the gateway does not use the pool's
// region (a failover order that leaves it out). Without an order every pool is at 0.
func regionOf(order []string, pool *policies.Pool) (int, bool) {
	if order == nil {
		return 0, true
	}
	for i, r := range order {
		if r == pool.Region {
			return i, i < maxRegions
		}
	}
	return 0, false
}

// holdBack ranks the candidates of a region that is up again after being down behind every other region, for
// as long as the policy's failback holds it.
func (d *decision) holdBack(order []string, counts *regionCounts) {
	if len(order) < 2 {
		return
	}
	now, failback := d.p.now(), d.snap.RegionFailback()
	var heldBack [maxRegions]bool
	anyHeld := false
	for r := range min(len(order), maxRegions) {
		if counts.seen[r] == 0 {
			continue
		}
		key := regionKey{d.in.Model.Name, order[r]}
		if d.p.regions.held(key, counts.up[r] > 0, now, failback) {
			heldBack[r], anyHeld = true, true
		}
	}
	if !anyHeld {
		return
	}
	for i := range d.all {
		if c := &d.all[i]; heldBack[c.region] {
			c.region += len(order)
		}
	}
}

// placeNearest places a request by score in the nearest region with a candidate the load bound keeps (see
// Regions); none anywhere is overflow.
func (d *decision) placeNearest(cands []scored) (Decision, error) {
	sortScored(cands, true, func(a, b *scored) int { return a.region - b.region })
	kvFull, tooLong := 0, 0
	for start := 0; start < len(cands); {
		end := start + 1
		for end < len(cands) && cands[end].region == cands[start].region {
			end++
		}
		region := cands[start:end]
		eligible, anyMatch, full := d.bound(region)
		if len(eligible) > 0 {
			d.score(eligible, region)
			return d.decide(d.order(eligible, region, anyMatch)), nil
		}
		kvFull, tooLong = kvFull+full, tooLong+d.tooLong
		start = end
	}
	d.tooLong = tooLong
	return d.overflow(kvFull)
}

// nearestOnly keeps, of candidates in any order, those of the nearest region among them (in place), and of all
// those of that region: placement by affinity alone under SLO placement stays in the nearest region.
func nearestOnly(eligible, all []scored, buf *[]scored) ([]scored, []scored) {
	if len(eligible) == 0 {
		return eligible, all
	}
	near := eligible[0].region
	for i := range eligible {
		near = min(near, eligible[i].region)
	}
	kept := eligible[:0]
	for i := range eligible {
		if eligible[i].region == near {
			kept = append(kept, eligible[i])
		}
	}
	peers := (*buf)[:0]
	for i := range all {
		if all[i].region == near {
			peers = append(peers, all[i])
		}
	}
	*buf = peers
	return kept, peers
}

// addRTT makes a candidate's prediction what the gateway will see: the round trip to a remote region added to
// its TTFT (at the mean, idle, for a follow-up and for a split's decode leg).
func (c *scored) addRTT() {
	if c.rtt <= 0 {
		return
	}
	c.pred.rtt = c.rtt
	c.pred.TTFT += c.rtt
	c.pred.idle += c.rtt
	c.pred.decodeLeg += c.rtt
	c.grp.followTTFT += c.rtt
}

// atEngine is a prediction and a measured TTFT as the endpoint's own model learns them: without the round trip
// to its region.
func (pd Prediction) atEngine(ttft time.Duration) (Prediction, time.Duration) {
	if pd.rtt <= 0 {
		return pd, ttft
	}
	pd.TTFT -= pd.rtt
	pd.idle -= pd.rtt
	return pd, max(0, ttft-pd.rtt)
}
