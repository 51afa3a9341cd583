package regionnet

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// FailoverTarget is issue #39's bound on the time to fail over.
const FailoverTarget = 2 * time.Second

// Verdict is one target of a scenario and whether it was met.
type Verdict struct {
	Target string
	Met    bool
}

// Verdicts are a scenario's targets: nothing failed beyond the cuts, no residency violation, no cross-region
// request while healthy, failover within FailoverTarget and failback without flapping (or, when the home region
// stays up, none of its requests leaving it).
func (f Figures) Verdicts() []Verdict {
	v := []Verdict{
		{Target: "0 requests failed beyond the cuts", Met: f.Failed == 0},
		{Target: "0 residency violations", Met: f.Violations == 0},
		{Target: "0 cross-region requests while healthy", Met: f.CrossHealthy == 0},
	}
	if f.QuotaLimit > 0 {
		v = append(v, Verdict{Target: fmt.Sprintf("quota: ≤ %d in every window outside the fault", f.QuotaLimit), Met: f.QuotaWorst <= f.QuotaLimit},
			Verdict{Target: fmt.Sprintf("quota: ≤ %.0f in every window during it", f.QuotaFaultBound), Met: float64(f.QuotaFaultWorst) <= f.QuotaFaultBound})
	}
	if f.GatewayDown {
		v = append(v, Verdict{Target: fmt.Sprintf("ext_proc failover < %v", FailoverTarget), Met: f.Blackout >= 0 && f.Blackout < FailoverTarget})
	}
	if f.HomeUp {
		return append(v, Verdict{Target: "home's requests never left home", Met: len(f.Elsewhere) == 0 && f.Flaps == 0})
	}
	return append(v, Verdict{Target: fmt.Sprintf("failover < %v", FailoverTarget), Met: f.Failover >= 0 && f.Failover < FailoverTarget},
		Verdict{Target: "failback, without flapping (≤ 1 switch)", Met: f.Failback >= 0 && f.Flaps <= 1})
}

// Report prints a scenario's figures and its targets as met / not met; it says whether one was not met.
func (f Figures) Report(w io.Writer) (notMet bool) {
	fmt.Fprintf(w, "  sent %d, failed %d, refused %d (clear 429/503), cut %d (no resident region reachable, or the home gateway dead before its data plane failed over)\n", f.Sent, f.Failed, f.Refused, f.Cut)
	if f.GatewayDown {
		fmt.Fprintf(w, "  the home data plane's ext_proc failed over %s after its gateway died\n", dur(f.Blackout))
	}
	fmt.Fprintf(w, "  failover %s, failback %s, flaps %d; home's requests served elsewhere during the outage: %s (median %s)\n",
		dur(f.Failover), dur(f.Failback), f.Flaps, counts(f.Elsewhere), f.ElsewhereTook.Round(time.Millisecond))
	if f.QuotaLimit > 0 {
		fmt.Fprintf(w, "  metered tenant (limit %d/s, offered twice that by each region): admitted %.1f/s outside the fault (worst window %d), %.1f/s during it (worst %d, bound %.0f)\n",
			f.QuotaLimit, f.QuotaRate, f.QuotaWorst, f.QuotaFaultRate, f.QuotaFaultWorst, f.QuotaFaultBound)
	}
	for _, e := range f.Examples {
		fmt.Fprintln(w, "  failed:", e)
	}
	if len(f.Refusals) > 0 {
		fmt.Fprintln(w, "  refused:", counts(f.Refusals))
	}
	for _, v := range f.Verdicts() {
		verdict := "met"
		if !v.Met {
			verdict, notMet = "NOT MET", true
		}
		fmt.Fprintf(w, "  %-44s %s\n", v.Target, verdict)
	}
	return notMet
}

// Table prints scenarios as RELIABILITY.md's regions table.
func Table(w io.Writer, all []Figures) {
	fmt.Fprintln(w, "| scenario | sent | failed | refused | cut | residency violations | cross-region while healthy | failover | failback | flaps | home's requests elsewhere (median time) | metered: worst window outside / during the fault (bound) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, f := range all {
		over, back := dur(f.Failover), dur(f.Failback)
		switch {
		case f.GatewayDown:
			over, back = "ext_proc "+dur(f.Blackout), "none needed"
		case f.HomeUp:
			over, back = "none needed", "none needed"
		}
		quota := "—"
		if f.QuotaLimit > 0 {
			quota = fmt.Sprintf("%d / %d (%.0f)", f.QuotaWorst, f.QuotaFaultWorst, f.QuotaFaultBound)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %d | %s | %s | %d | %s (%s) | %s |\n", f.Name, f.Sent, f.Failed, f.Refused, f.Cut, f.Violations,
			f.CrossHealthy, over, back, f.Flaps, counts(f.Elsewhere), f.ElsewhereTook.Round(time.Millisecond), quota)
	}
}

func dur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

func counts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
