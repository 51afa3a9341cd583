package regionnet

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Phases are how long each phase of a scenario lasts, and how often each region gets a request.
type Phases struct {
	Warm, Outage, Recovery, Interval time.Duration
}

// DefaultPhases are make chaos-regions' phases.
var DefaultPhases = Phases{Warm: 4 * time.Second, Outage: 10 * time.Second, Recovery: 12 * time.Second, Interval: 40 * time.Millisecond}

// Scenario is one fault of the home region (the cluster's first) or its links, begun and ended around the
// outage. Every region's traffic cycles through the open tenant, its own pinned tenant and the far region's
// (the last region's: pinned away from the others).
type Scenario struct {
	Name, What string
	Begin, End func(ctx context.Context, c *Cluster) error
	// Cut says which pinned tenants lose every resident region during the fault, sent to which region: their
	// failures are counted apart.
	Cut func(c *Cluster, region, tenant string) bool
	// HomeUp says the home region's engines stay up: nothing should fail over, and no open request leave its
	// region at any time.
	HomeUp bool
	// RedisCut says every other region loses Redis (which lives in the home region) during the fault.
	RedisCut bool
	// GatewayDown says the fault is the home region's infergate: its data plane's ext_proc fails over to
	// another region's, and the home region's requests that fail before it has (Blackout) are cut.
	GatewayDown bool
}

// Scenarios are the faults of issue #39, for a cluster of at least two regions.
func Scenarios() []Scenario {
	refuse := func(on bool) func(ctx context.Context, c *Cluster) error {
		return func(ctx context.Context, c *Cluster) error {
			return c.Faults(ctx, c.home(), fmt.Sprintf(`{"refuse":%v}`, on))
		}
	}
	// With home's engines down, home's pinned tenant has no resident capacity left (no managed API inside).
	homeCut := func(c *Cluster, _, tenant string) bool { return tenant == "pinned-"+c.home() }
	return []Scenario{
		{Name: "region-down", What: "the home region's engines refuse connections", Begin: refuse(true), End: refuse(false), Cut: homeCut},
		{Name: "partition", What: "the home region cut off from the others (both ways, Redis with it)",
			Begin: partition(true), End: partition(false), HomeUp: true, RedisCut: true,
			// From home, the far region's pinned tenant has no resident region left.
			Cut: func(c *Cluster, region, tenant string) bool { return region == c.home() && tenant == "pinned-"+c.far() }},
		{Name: "slow-region", What: "the next region's links 5× slower, then the home region's engines down",
			Begin: func(ctx context.Context, c *Cluster) error {
				if err := slow(ctx, c, c.Regions[1], 5); err != nil {
					return err
				}
				return refuse(true)(ctx, c)
			},
			End: func(ctx context.Context, c *Cluster) error {
				if err := slow(ctx, c, c.Regions[1], 1); err != nil {
					return err
				}
				return refuse(false)(ctx, c)
			}, Cut: homeCut},
		{Name: "gateway-down", What: "the home region's infergate killed (SIGKILL), then started again",
			Begin: func(_ context.Context, c *Cluster) error {
				c.Proc(c.home(), "infergate").Kill()
				return nil
			},
			End:         func(ctx context.Context, c *Cluster) error { return c.StartGateway(ctx, c.home()) },
			HomeUp:      true,
			GatewayDown: true,
			Cut:         func(*Cluster, string, string) bool { return false }},
		{Name: "managed-down", What: "the home region's engines down and the managed API outside the regions down",
			Begin: func(ctx context.Context, c *Cluster) error {
				c.Managed.Kill()
				return refuse(true)(ctx, c)
			},
			End: func(ctx context.Context, c *Cluster) error {
				if err := c.StartManaged(ctx); err != nil {
					return err
				}
				return refuse(false)(ctx, c)
			}, Cut: homeCut},
	}
}

// home is the region whose faults the scenarios inject; far the region whose pinned tenant every region sends.
func (c *Cluster) home() string { return c.Regions[0] }
func (c *Cluster) far() string  { return c.Regions[len(c.Regions)-1] }

// partition cuts home off from the other regions (on) or joins it again.
func partition(on bool) func(ctx context.Context, c *Cluster) error {
	return func(ctx context.Context, c *Cluster) error {
		for _, other := range c.Regions[1:] {
			for _, pair := range [][2]string{{c.home(), other}, {other, c.home()}} {
				links, err := c.Links(pair[0], pair[1])
				if err != nil {
					return err
				}
				for _, l := range links {
					if on {
						err = l.Disable()
					} else {
						err = l.Enable()
					}
					if err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
}

// slow multiplies every link to and from region by factor (1: back to its RTT).
func slow(ctx context.Context, c *Cluster, region string, factor int) error {
	for _, other := range c.Regions {
		if other == region {
			continue
		}
		for _, pair := range [][2]string{{region, other}, {other, region}} {
			links, err := c.Links(pair[0], pair[1])
			if err != nil {
				return err
			}
			half := c.RTT(pair[0], pair[1]) / 2 * time.Duration(factor)
			for _, l := range links {
				for _, stream := range []string{"upstream", "downstream"} {
					if _, err := l.UpdateToxic("rtt-"+stream, 1, map[string]any{"latency": half.Milliseconds()}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// Run runs traffic through a healthy warm-up, the scenario's fault and the recovery, and measures. atEnd, when
// set, is called at the end of the outage (to save what the gateways export).
func (c *Cluster) Run(ctx context.Context, s Scenario, p Phases, atEnd func()) (Figures, error) {
	tr := c.StartTraffic(ctx, p.Interval, "open", "pinned-home", "pinned-"+c.far())
	var metered *Traffic
	if c.opts.MeteredRPS > 0 {
		// Each region offers the metered tenant twice its whole limit.
		metered = c.StartTraffic(ctx, time.Second/time.Duration(2*c.opts.MeteredRPS), "metered")
	}
	sleep(ctx, p.Warm)
	t0 := time.Now()
	if err := s.Begin(ctx, c); err != nil {
		tr.Stop()
		return Figures{}, fmt.Errorf("%s: begin: %w", s.Name, err)
	}
	sleep(ctx, p.Outage)
	if atEnd != nil {
		atEnd()
	}
	t1 := time.Now()
	if err := s.End(ctx, c); err != nil {
		tr.Stop()
		return Figures{}, fmt.Errorf("%s: end: %w", s.Name, err)
	}
	ended := time.Now() // the fault is over: the quota's windows up to a second after this count with neither
	sleep(ctx, p.Recovery)
	records := tr.Stop()
	if err := ctx.Err(); err != nil {
		return Figures{}, err
	}
	f := c.measure(s, records, t0, t1)
	if metered != nil {
		c.measureQuota(&f, s, metered.Stop(), t0, ended)
	}
	return f, nil
}

// quotaRecovery is how long after a partition heals a gateway that was cut off from Redis may still admit its
// fail mode's share: go-redis dials again only once a second after a run of failed dials, then the next probe
// (every 250 ms) pings and replays; half a second more for a busy machine. A partition run counted 13 in the
// window after a one-second allowance.
const quotaRecovery = 1750 * time.Millisecond

// measureQuota counts the metered tenant's admitted requests across every region in each one-second window its
// requestsPerSecond limit is kept in (as the gateways' x-ratelimit-reset-requests tell): the most in a window
// before the fault or after it (the limit), and in one during it (the limit the fault allows: docs/regions.md —
// regions cut off from Redis admit ⌈limit ÷ gatewayReplicas⌉ each, the others the whole limit); and the rate
// over each. Windows the fault's start falls in, and those up to quotaRecovery after its end (t1: when ending
// it returned, as healing links takes time on a busy machine), count with neither: a gateway cut off from
// Redis keeps its fail mode until its probe reaches Redis again (docs/regions.md).
func (c *Cluster) measureQuota(f *Figures, s Scenario, records []Record, t0, t1 time.Time) {
	perWindow := map[int64]int{}
	for _, r := range records {
		if r.Window != 0 {
			perWindow[r.Window]++
		}
	}
	f.QuotaLimit, f.QuotaFaultBound = c.opts.MeteredRPS, float64(c.opts.MeteredRPS)
	if s.RedisCut { // one gateway per region, gatewayReplicas the regions' count: each admits ⌈limit ÷ it⌉
		share := (c.opts.MeteredRPS + len(c.Regions) - 1) / len(c.Regions)
		f.QuotaFaultBound += float64(share * (len(c.Regions) - 1))
	}
	var out, fault, outWindows, faultWindows int
	for end, n := range perWindow {
		from, to := time.Unix(end-1, 0), time.Unix(end, 0)
		switch {
		case !from.Before(t0) && !to.After(t1):
			fault, faultWindows = fault+n, faultWindows+1
			f.QuotaFaultWorst = max(f.QuotaFaultWorst, n)
		case to.Before(t0) || from.After(t1.Add(quotaRecovery)):
			out, outWindows = out+n, outWindows+1
			f.QuotaWorst = max(f.QuotaWorst, n)
		}
	}
	if outWindows > 0 {
		f.QuotaRate = float64(out) / float64(outWindows)
	}
	if faultWindows > 0 {
		f.QuotaFaultRate = float64(fault) / float64(faultWindows)
	}
}

// Figures are one scenario's measurements.
type Figures struct {
	Name string
	// Sent requests; Failed: no answer, or a non-2xx that is not an OpenAI-shaped refusal, where capacity was
	// left inside the tenant's residency; Refused: clear 429/503 answers; Cut: failures of pinned requests
	// whose every resident region was cut off.
	Sent, Failed, Refused, Cut int
	// Violations: answers served outside the tenant's residency. CrossHealthy: open requests served by another
	// region while their own was healthy (before the fault and after the failback settled; throughout when
	// the home region stays up).
	Violations, CrossHealthy int
	// Failover, Failback: from the fault (its end) until every later open request of the home region was
	// served elsewhere (at home again); -1 when it never was. Flaps: switches between home and elsewhere
	// after the fault ended.
	Failover, Failback time.Duration
	Flaps              int
	// Elsewhere counts, per region, the home region's open requests served there during the outage, and
	// ElsewhereTook is the median time they took.
	Elsewhere     map[string]int
	ElsewhereTook time.Duration
	// Examples are the first failed requests; Refusals the refused ones by code, region and tenant.
	Examples []string
	Refusals map[string]int
	HomeUp   bool
	// GatewayDown: Blackout is how long after the home region's infergate died its data plane's requests
	// failed, until its ext_proc failed over (-1: it never did); those failures are counted as cut.
	GatewayDown bool
	Blackout    time.Duration
	// QuotaLimit is the metered tenant's requests per second (0: not measured), QuotaFaultBound what the fault
	// allows; QuotaRate and QuotaFaultRate are the rates admitted across every region outside the fault and
	// during it, QuotaWorst and QuotaFaultWorst the most admitted in one second.
	QuotaLimit, QuotaWorst, QuotaFaultWorst    int
	QuotaRate, QuotaFaultRate, QuotaFaultBound float64
}

// measure turns a scenario's records into its figures.
func (c *Cluster) measure(s Scenario, records []Record, t0, t1 time.Time) Figures {
	home := c.home()
	f := Figures{Name: s.Name, Sent: len(records), Failover: -1, Failback: -1, Elsewhere: map[string]int{}, HomeUp: s.HomeUp,
		Refusals: map[string]int{}, GatewayDown: s.GatewayDown, Blackout: -1}
	slices.SortFunc(records, func(a, b Record) int { return a.At.Compare(b.At) })
	answered := func(r Record) bool { return r.Err == nil && (r.Status/100 == 2 || r.Code != "") }
	if s.GatewayDown {
		var fromHome []Record
		for _, r := range records {
			if r.Region == home && !r.At.Add(r.Took).Before(t0) {
				fromHome = append(fromHome, r)
			}
		}
		f.Blackout = max(0, settle(fromHome, t0, t1, answered))
	}
	settled := t1.Add(c.opts.Failback + 3*time.Second)
	var timed []Record // the home region's open requests from the fault on
	var took []time.Duration
	for _, r := range records {
		// A request in flight when the fault began counts as sent during it.
		inFault := !r.At.Add(r.Took).Before(t0) && r.At.Before(t1.Add(time.Second))
		switch {
		case r.Status/100 == 2 && r.Err == nil:
		case r.Code != "" && r.Err == nil:
			f.Refused++
			f.Refusals[fmt.Sprintf("%s to %s as %s", r.Code, r.Region, r.Tenant)]++
		case inFault && s.Cut(c, r.Region, r.Tenant),
			s.GatewayDown && r.Region == home && !r.At.Add(r.Took).Before(t0) && r.At.Before(t0.Add(f.Blackout)):
			f.Cut++
		default:
			f.Failed++
			if len(f.Examples) < 5 {
				f.Examples = append(f.Examples, fmt.Sprintf("%s as %s at %+.2fs: status %d, %v", r.Region, r.Tenant, r.At.Sub(t0).Seconds(), r.Status, r.Err))
			}
		}
		if !r.Resident() {
			f.Violations++
		}
		healthy := s.HomeUp || r.At.Add(r.Took).Before(t0) || r.At.After(settled)
		if healthy && r.Tenant == "open" && r.Served != "" && r.Served != r.Region {
			f.CrossHealthy++
		}
		if r.Region == home && r.Tenant == "open" && !r.At.Before(t0) {
			timed = append(timed, r)
			if r.At.Before(t1) && r.Served != "" && r.Served != home {
				f.Elsewhere[r.Served]++
				took = append(took, r.Took)
			}
		}
	}
	if len(took) > 0 {
		slices.Sort(took)
		f.ElsewhereTook = took[len(took)/2]
	}
	away := func(r Record) bool { return r.Status/100 == 2 && r.Served != "" && r.Served != home }
	atHome := func(r Record) bool { return r.Status/100 == 2 && r.Served == home }
	f.Failover = settle(timed, t0, t1, away)
	var after []Record
	for _, r := range timed {
		if !r.At.Before(t1) {
			after = append(after, r)
		}
	}
	f.Failback = settle(after, t1, time.Now(), atHome)
	for i := 1; i < len(after); i++ {
		if after[i].Status/100 == 2 && after[i-1].Status/100 == 2 && atHome(after[i]) != atHome(after[i-1]) {
			f.Flaps++
		}
	}
	return f
}

// settle is how long after from the records (sorted, from from on) took until every one before until was ok:
// the time of the first of the last unbroken run of ok records; -1 when the last one before until is not ok.
func settle(records []Record, from, until time.Time, ok func(Record) bool) time.Duration {
	first := -1
	for i, r := range records {
		if !r.At.Before(until) {
			break
		}
		switch {
		case !ok(r):
			first = -1
		case first < 0:
			first = i
		}
	}
	if first < 0 {
		return -1
	}
	return records[first].At.Sub(from)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
