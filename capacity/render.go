package capacity

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Render writes the plans as tables for people.
func Render(w io.Writer, plans []ModelPlan) {
	for i, mp := range plans {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s (%s, weights %s, KV cache %s) at %g req/s; SLO TTFT %s, TPOT %s\n", mp.Model, mp.Architecture,
			mp.Weights, mp.KVCache, mp.RequestsPerSecond, orNone(mp.TTFT), orNone(mp.TPOT))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tCLASS\tGPUS\tKV B/TOKEN\tWEIGHTS/GPU\tKV/GPU\tKV TOKENS\tSEQS\tBATCH (BOUND)\tTPOT\tDECODE TOK/S\tPREFILL\tREQ/S/REPLICA\tREPLICAS\tTTFT p95\t$/HOUR\t$/1M OUT")
		for _, p := range mp.Pools {
			if !p.Fits {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", p.Pool, p.HardwareClass, p.GPUsPerReplica,
					p.KVBytesPerToken, gibOrDash(p.WeightsGiBPerGPU), gibOrDash(p.KVPoolGiBPerGPU), countOrDash(p.KVTokensPerReplica))
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.1f GiB\t%.1f GiB\t%d\t%d\t%d (%s)\t%s\t%.0f\t%s\t%.2f\t%d\t%s\t%.2f\t%.2f\n",
				p.Pool, p.HardwareClass, p.GPUsPerReplica, p.KVBytesPerToken, p.WeightsGiBPerGPU, p.KVPoolGiBPerGPU,
				p.KVTokensPerReplica, p.MaxSequences, p.Batch, p.BatchLimit, ms(p.TPOT), p.DecodeTokensPerSecond, ms(p.Prefill),
				p.RequestsPerSecondPerReplica, p.Replicas, ms(p.TTFTP95), p.CostPerHour, p.CostPerMOutputTokens)
		}
		_ = tw.Flush()
		for _, p := range mp.Pools {
			if !p.Fits {
				fmt.Fprintf(w, "  %s does not fit: %s\n", p.Pool, p.Why)
				continue
			}
			var rows []string
			for _, h := range p.ByHitRate {
				if !h.Fits {
					rows = append(rows, fmt.Sprintf("%.0f%% → does not fit", 100*h.HitRate))
					continue
				}
				rows = append(rows, fmt.Sprintf("%.0f%% → %d ($%.2f/h)", 100*h.HitRate, h.Replicas, h.CostPerHour))
			}
			fmt.Fprintf(w, "  %s replicas by prefix-cache hit rate: %s\n", p.Pool, strings.Join(rows, ", "))
		}
		renderDisagg(w, mp)
		switch {
		case mp.Cheapest == "":
			fmt.Fprintln(w, "  no pool can serve this model within its SLO")
		case mp.Managed == nil:
			fmt.Fprintf(w, "  cheapest: %s (no fallback with pricing to compare)\n", mp.Cheapest)
		case mp.Managed.Never:
			fmt.Fprintf(w, "  cheapest: %s; the managed API (%s, $%.2f/h for this load) costs less at any load\n", mp.Cheapest, mp.Managed.Fallback, mp.Managed.CostPerHour)
		default:
			fmt.Fprintf(w, "  cheapest: %s; the managed API (%s) would cost $%.2f/h for this load; self-hosting costs less above %.2f req/s\n",
				mp.Cheapest, mp.Managed.Fallback, mp.Managed.CostPerHour, mp.Managed.CrossoverRequestsPerSecond)
		}
	}
}

func orNone(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", d.Seconds()*1e3) }

func gibOrDash(g float64) string {
	if g <= 0 {
		return fmt.Sprintf("%.1f GiB (none)", g)
	}
	return fmt.Sprintf("%.1f GiB", g)
}

func countOrDash(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// renderDisagg writes a disaggregated model's prefill:decode pairs.
func renderDisagg(w io.Writer, mp ModelPlan) {
	if len(mp.Disaggregated) == 0 {
		return
	}
	fmt.Fprintln(w, "  disaggregated (prefill pool : decode pool):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PREFILL\tREQ/S/REPLICA\tREPLICAS\tDECODE\tBATCH\tTPOT\tREQ/S/REPLICA\tREPLICAS\tRATIO\tTRANSFER p95\tTTFT p95\t$/HOUR\t$/1M OUT")
	for _, d := range mp.Disaggregated {
		if !d.Fits {
			fmt.Fprintf(tw, "  %s\t-\t-\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\n", d.PrefillPool, d.DecodePool)
			continue
		}
		fmt.Fprintf(tw, "  %s\t%.2f\t%d\t%s\t%d\t%s\t%.2f\t%d\t%d:%d\t%s\t%s\t%.2f\t%.2f\n", d.PrefillPool,
			d.PrefillRequestsPerSecondPerReplica, d.PrefillReplicas, d.DecodePool, d.DecodeBatch, ms(d.TPOT),
			d.DecodeRequestsPerSecondPerReplica, d.DecodeReplicas, d.PrefillReplicas, d.DecodeReplicas, ms(d.TransferP95),
			ms(d.TTFTP95), d.CostPerHour, d.CostPerMOutputTokens)
	}
	_ = tw.Flush()
	for _, d := range mp.Disaggregated {
		if !d.Fits {
			fmt.Fprintf(w, "  %s : %s does not fit: %s\n", d.PrefillPool, d.DecodePool, d.Why)
		}
	}
}
