package audit

import "time"

// Record is one settled request as the audit log keeps it: never the prompt or output text, never a key.
// Hashes stand in for the text so a disputed exchange can be matched against a copy the tenant holds without
// the platform keeping it.
type Record struct {
	// Time is when the request settled; Write fills a zero Time from Options.Now. It is written as
	// RFC 3339 with nanoseconds, in UTC.
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	TraceID   string    `json:"trace_id,omitempty"`
	// Tenant names the file the line goes to in Dir mode (see Options.Dir).
	Tenant   string `json:"tenant"`
	Tier     string `json:"tier,omitempty"`
	Model    string `json:"model"`
	Pool     string `json:"pool,omitempty"`
	Endpoint string `json:"endpoint,omitempty"`
	// PrefillEndpoint is where a split request's prompt was prefilled (its decode endpoint is Endpoint).
	PrefillEndpoint string `json:"prefill_endpoint,omitempty"`
	// PrefillFailed says its prefill leg failed and the decode replica's engine, past its sidecar, served it whole.
	PrefillFailed bool `json:"prefill_failed,omitempty"`
	// PromptDigest and OutputDigest are lower-case hex HMAC-SHA256 digests of the prompt field as sent and of
	// the output text, under the key DigestKey names (see DigestKey).
	PromptDigest     string `json:"prompt_hmac,omitempty"`
	OutputDigest     string `json:"output_hmac,omitempty"`
	DigestKey        string `json:"digest_key,omitempty"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	// CostUSD, TTFTMillis and E2EMillis are written as 0 when they are NaN or infinite, which JSON cannot
	// carry, rather than losing the line.
	CostUSD    float64 `json:"cost_usd"`
	TTFTMillis float64 `json:"ttft_ms"`
	E2EMillis  float64 `json:"e2e_ms"`
	// Status is the HTTP status returned to the client.
	Status int `json:"status,omitempty"`
	// Outcome is how the request ended, as the director classes it ("ok", "client_error", "quota", …).
	Outcome string `json:"outcome"`
	// Good says whether the request met the SLO targets it was judged against.
	Good bool `json:"good"`
	// Shadow marks a copy sent to a rollout's candidate in its shadow phase: no client saw it, no tenant paid.
	Shadow bool `json:"shadow,omitempty"`
}
