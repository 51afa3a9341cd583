package audit

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// encodingJSON is the reference: what encoding/json writes for r with HTML escaping off.
func encodingJSON(t testing.TB, r Record) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	r.Time = r.Time.UTC()
	if err := enc.Encode(&r); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestAppendLineIsEncodingJSON(t *testing.T) {
	cases := []Record{
		{},
		{Time: time.Date(2026, 12, 1, 10, 30, 0, 123456789, time.FixedZone("x", 3600)), RequestID: "r-1", TraceID: "abc",
			Tenant: "acme", Tier: "enterprise", Model: "llama", Pool: "fallback/together", Endpoint: "10.0.0.1:8000", PrefillEndpoint: "10.0.2.1:8000", PrefillFailed: true,
			PromptDigest: "aa", OutputDigest: "bb", PromptTokens: 1 << 40, CachedTokens: 7, CompletionTokens: -1,
			CostUSD: 0.000123, TTFTMillis: 12.5, E2EMillis: 1e22, Status: 429, Outcome: "quota", Good: true},
		{RequestID: "quote\" back\\ nl\n tab\t cr\r bell\x07 del\x7f <html>&", Tenant: "bad\xff\xfeutf8", Model: "é\u2028\u2029😀",
			CostUSD: 1e-9, TTFTMillis: -0.0000001, E2EMillis: 123456789.25},
	}
	for _, r := range cases {
		if got, want := appendLine(nil, &r), encodingJSON(t, r); !bytes.Equal(got, want) {
			t.Errorf("appendLine\n got %s\nwant %s", got, want)
		}
	}
}

func FuzzAppendLine(f *testing.F) {
	f.Add("r", "acme", "m\x00\xff", 1.5, int64(3))
	f.Fuzz(func(t *testing.T, id, tenant, model string, cost float64, tokens int64) {
		if math.IsNaN(cost) || math.IsInf(cost, 0) {
			cost = 0 // the writer maps them to 0 before encoding (finite)
		}
		r := Record{RequestID: id, Tenant: tenant, Model: model, CostUSD: cost, PromptTokens: tokens, Outcome: tenant}
		if got, want := appendLine(nil, &r), encodingJSON(t, r); !bytes.Equal(got, want) {
			t.Fatalf("appendLine\n got %s\nwant %s", got, want)
		}
	})
}
