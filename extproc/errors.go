package extproc

// The stages answer in their own terms — a director.Refusal, a quota.Rejection, a picker.NoCapacity — and this
// file alone turns them into the OpenAI errors and statuses clients' SDKs understand.

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/quota"
)

// clientError maps an error from parsing or routing to the client's answer.
func clientError(err error) *openai.Error {
	var oe *openai.Error
	if errors.As(err, &oe) { // the OpenAI surface's own errors (bodies that do not parse) are already shaped
		return oe
	}
	var r *director.Refusal
	if !errors.As(err, &r) {
		return openai.Internal("The gateway failed to route the request.")
	}
	var rej *quota.Rejection
	var nc *picker.NoCapacity
	switch {
	case r.Reason == director.ModelNotFound:
		return openai.ModelNotFound(r.Model)
	case r.Reason == director.ModelForbidden:
		return openai.ModelForbidden(r.Model)
	case r.Reason == director.OutputTooLarge:
		return openai.BadRequest("max_tokens", "max_tokens is too large: %d. This model's context is %d tokens; ask for at most that many.",
			r.MaxTokens, r.ContextTokens)
	case r.Reason == director.TooManyChoices:
		return openai.BadRequest("n", "The request asks for %d completions (n, or best_of); this gateway allows at most %d per request.",
			r.Choices, r.MaxChoices)
	case errors.As(r.Err, &rej):
		return quotaError(rej, r.Tenant, r.Model)
	case errors.Is(r.Err, quota.ErrUnavailable):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeServiceUnavailable, Code: "quota_unavailable",
			Message: "The quota service is unavailable and this gateway fails closed; please retry shortly."}
	case r.Reason == director.ClientGone:
		return &openai.Error{Status: 499, Type: openai.TypeInvalidRequest, Code: "client_closed_request",
			Message: "The client closed the request while it waited for capacity."} // no one reads it: for logs
	case errors.As(r.Err, &nc) && nc.Residency != nil:
		return openai.OutsideResidency(nc.Model, nc.Residency, nc.RetryAfter)
	case errors.As(r.Err, &nc) && nc.Saturated:
		return openai.Overloaded(nc.Model, nc.RetryAfter)
	case errors.As(r.Err, &nc):
		return openai.NoCapacity(nc.Model)
	case r.Reason == director.QuotaFailed:
		return openai.Internal("The gateway could not check your quota.")
	}
	return openai.Internal("The gateway failed to route the request.")
}

var quotaKindNames = map[string]string{
	quota.KindRequests:     "requests per second (RPS)",
	quota.KindTokens:       "tokens per minute (TPM)",
	quota.KindConcurrency:  "concurrent requests",
	quota.KindSpend:        "monthly spend (micro-USD)",
	quota.KindConversation: "tokens per conversation",
}

// quotaError renders a quota rejection as the OpenAI-style 429 clients' SDKs understand: the envelope plus
// x-ratelimit-* and retry-after headers.
func quotaError(r *quota.Rejection, tenant, model string) *openai.Error {
	scope := "tenant " + tenant
	if r.Scope != "tenant" {
		scope += " on model " + model
	}
	e := &openai.Error{Status: 429, Header: map[string]string{}}
	retry := max(r.Reset, time.Millisecond)
	switch r.Kind {
	case quota.KindSpend:
		e.Type, e.Code = openai.TypeInsufficientQuota, "insufficient_quota"
		e.Message = fmt.Sprintf("You exceeded your current quota (monthly spend limit of $%.2f for %s); please check your plan and billing details.",
			float64(r.Limit)/1e6, scope)
		e.Header["x-should-retry"] = "false"
		return e
	case quota.KindConversation:
		e.Type, e.Code = "tokens", "conversation_token_limit"
		e.Message = fmt.Sprintf("This conversation reached its token limit for %s: Limit %d, Used %d, Requested %d.", scope, r.Limit, r.Used, r.Requested)
		e.Header["x-should-retry"] = "false"
		return e
	}
	e.Code = "rate_limit_exceeded"
	unit := "requests"
	if r.Kind == quota.KindTokens {
		unit = "tokens"
	}
	e.Type = unit
	if r.Requested > r.Limit {
		// No wait makes this request fit: tell the SDKs not to retry it (they honour x-should-retry).
		e.Message = fmt.Sprintf("This request needs %d %s, more than the %s limit of %d for %s: it can never be admitted. Lower max_tokens or shorten the prompt.",
			r.Requested, unit, quotaKindNames[r.Kind], r.Limit, scope)
		e.Header["x-should-retry"] = "false"
		e.Header["x-ratelimit-limit-"+unit] = strconv.FormatInt(r.Limit, 10)
		return e
	}
	e.Message = fmt.Sprintf("Rate limit reached for %s on %s: Limit %d, Used %d, Requested %d. Please try again in %s.",
		quotaKindNames[r.Kind], scope, r.Limit, r.Used, r.Requested, retry.Round(time.Millisecond))
	remaining := max(0, r.Limit-r.Used)
	e.Header["x-ratelimit-limit-"+unit] = strconv.FormatInt(r.Limit, 10)
	e.Header["x-ratelimit-remaining-"+unit] = strconv.FormatInt(remaining, 10)
	e.Header["x-ratelimit-reset-"+unit] = retry.Round(time.Millisecond).String()
	e.Header["retry-after"] = strconv.FormatInt(int64(math.Ceil(retry.Seconds())), 10)
	e.Header["retry-after-ms"] = strconv.FormatInt(retry.Milliseconds(), 10)
	return e
}

// rateLimitHeaders are the x-ratelimit-* headers OpenAI sends on every response, from the budgets left after a
// request's admission: SDK users read their remaining budget from successful responses.
func rateLimitHeaders(s *headerSet, budgets []quota.Budget) {
	for _, b := range budgets {
		limit, remaining, reset := "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"
		if b.Kind == quota.KindTokens {
			limit, remaining, reset = "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"
		}
		s.setInt(limit, b.Limit)
		s.setInt(remaining, b.Remaining)
		s.set(reset, b.Reset.Round(time.Millisecond).String())
	}
}
