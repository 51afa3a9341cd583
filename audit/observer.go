package audit

import (
	"time"

	"github.com/infergate/infergate/director"
)

// Settled writes the request's line: Log is a director.SettleObserver. It never blocks.
func (l *Log) Settled(st director.Settlement) {
	l.Write(RecordOf(st))
}

// RecordOf is a settlement as the audit log keeps it.
func RecordOf(st director.Settlement) Record {
	t := st.Timing
	r := Record{
		Time: st.Started.Add(t.E2E), RequestID: st.RequestID, TraceID: st.TraceID, Tenant: st.Tenant, Tier: st.Tier,
		Model: st.Model, Pool: st.Pool, Endpoint: st.Endpoint, PrefillEndpoint: st.Prefill, PrefillFailed: st.PrefillFailed, PromptDigest: st.PromptDigest, OutputDigest: st.OutputDigest,
		DigestKey:    st.DigestKey,
		PromptTokens: st.Usage.PromptTokens, CachedTokens: st.Usage.CachedTokens, CompletionTokens: st.Usage.CompletionTokens,
		CostUSD: st.CostUSD, TTFTMillis: millis(t.TTFT.Seconds()), E2EMillis: millis(t.E2E.Seconds()), Status: st.Status,
		Outcome: st.Outcome, Good: st.Good, Shadow: st.Shadow,
	}
	if st.Started.IsZero() {
		r.Time = time.Time{} // Write stamps it
	}
	return r
}

func millis(seconds float64) float64 { return seconds * 1000 }
