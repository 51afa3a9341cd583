package extproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/quota"
)

// Every neutral error of the stages becomes the OpenAI error and status clients expect, in this one place.
func TestClientErrors(t *testing.T) {
	refusal := func(reason director.Reason, err error) error {
		return fmt.Errorf("route: %w", &director.Refusal{Reason: reason, Model: "m", Tenant: "acme", MaxTokens: 9, ContextTokens: 8, Err: err})
	}
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"parse error passes", openai.BadRequest("", "bad"), 400, "invalid_request"},
		{"model not found", refusal(director.ModelNotFound, nil), 404, "model_not_found"},
		{"forbidden", refusal(director.ModelForbidden, nil), 403, "model_not_allowed"},
		{"output too large", refusal(director.OutputTooLarge, nil), 400, "invalid_request"},
		{"too many choices", refusal(director.TooManyChoices, nil), 400, "invalid_request"},
		{"saturated", refusal(director.NoCapacity, &picker.NoCapacity{Model: "m", Saturated: true}), 429, "model_overloaded"},
		{"unavailable", refusal(director.NoCapacity, &picker.NoCapacity{Model: "m"}), 503, "server_is_overloaded"},
		{"quota store down, closed", refusal(director.QuotaFailed, quota.ErrUnavailable), 503, "quota_unavailable"},
		{"quota store failed", refusal(director.QuotaFailed, fmt.Errorf("boom")), 500, ""},
		{"spend", refusal(director.OverQuota, &quota.Rejection{Kind: quota.KindSpend, Scope: "tenant", Limit: 1000}), 429, "insufficient_quota"},
		{"conversation", refusal(director.OverQuota, &quota.Rejection{Kind: quota.KindConversation, Scope: "tenant"}), 429, "conversation_token_limit"},
		{"client gone while queued", refusal(director.ClientGone, nil), 499, "client_closed_request"},
		{"unknown", fmt.Errorf("something else"), 500, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := clientError(tc.err)
			if e.Status != tc.status || (tc.code != "" && e.Code != tc.code) {
				t.Errorf("got %d %q, want %d %q", e.Status, e.Code, tc.status, tc.code)
			}
		})
	}
}

// A request shed by the admission queue is told to come back when the queue has drained, not in a second.
func TestShedRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		retry     time.Duration
		after, ms string
	}{
		{0, "1", "500"},
		{2300 * time.Millisecond, "3", "2300"},
	} {
		e := clientError(&director.Refusal{Reason: director.NoCapacity, Model: "m",
			Err: &picker.NoCapacity{Model: "m", Saturated: true, RetryAfter: tc.retry}})
		if e.Status != 429 || e.Header["retry-after"] != tc.after || e.Header["retry-after-ms"] != tc.ms {
			t.Errorf("retry %v: %d, retry-after %q, retry-after-ms %q", tc.retry, e.Status, e.Header["retry-after"], e.Header["retry-after-ms"])
		}
	}
}

func TestQuotaErrorHeaders(t *testing.T) {
	e := quotaError(&quota.Rejection{Kind: quota.KindTokens, Scope: "tenant", Limit: 1000, Used: 900, Requested: 200, Reset: 6 * time.Millisecond}, "acme", "m")
	want := map[string]string{"x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "100",
		"x-ratelimit-reset-tokens": "6ms", "retry-after": "1", "retry-after-ms": "6"}
	for k, v := range want {
		if e.Header[k] != v {
			t.Errorf("%s = %q, want %q", k, e.Header[k], v)
		}
	}
	if e.Status != 429 || e.Code != "rate_limit_exceeded" || e.Type != "tokens" || !strings.Contains(e.Message, "Limit 1000, Used 900, Requested 200") {
		t.Errorf("error %+v", e)
	}
	if s := quotaError(&quota.Rejection{Kind: quota.KindSpend, Scope: "tenant", Limit: 1000}, "acme", "m"); s.Header["x-should-retry"] != "false" || s.Type != "insufficient_quota" {
		t.Errorf("spend error %+v", s)
	}
}

// A request larger than the limit itself can never fit: no retry, and the message says so.
func TestQuotaErrorForARequestThatNeverFits(t *testing.T) {
	e := quotaError(&quota.Rejection{Kind: quota.KindTokens, Scope: "tenant", Limit: 20000, Used: 0, Requested: 100050, Reset: 35 * time.Second}, "acme", "m")
	if e.Status != 429 || e.Header["x-should-retry"] != "false" || e.Header["retry-after"] != "" || !strings.Contains(e.Message, "can never be admitted") {
		t.Errorf("error %+v", e)
	}
}
