// Package openai knows the OpenAI-compatible HTTP API as far as a router must: which paths carry which body,
// the few request fields routing and quotas need (read without decoding the prompt), token usage in JSON and
// SSE responses, and the error envelope clients' SDKs expect.
package openai

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error is an OpenAI-shaped error: the status plus the {"error":{...}} envelope that SDKs turn into typed
// exceptions (BadRequestError, AuthenticationError, …), so clients can tell a typo from an outage.
type Error struct {
	Status  int
	Type    string
	Code    string // empty encodes as null
	Param   string // empty encodes as null
	Message string
	// Header holds response headers that go with the error (retry-after, x-ratelimit-*).
	Header map[string]string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

type errorEnvelope struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Body renders the JSON error envelope.
func (e *Error) Body() []byte {
	env := errorEnvelope{Error: errorBody{Message: e.Message, Type: e.Type}}
	if e.Code != "" {
		env.Error.Code = &e.Code
	}
	if e.Param != "" {
		env.Error.Param = &e.Param
	}
	b, _ := json.Marshal(env) // only strings: cannot fail
	return b
}

// Error types and codes used by the gateway, following OpenAI's conventions.
const (
	TypeInvalidRequest     = "invalid_request_error"
	TypeAuthentication     = "authentication_error"
	TypePermission         = "permission_error"
	TypeRateLimit          = "rate_limit_error"
	TypeInsufficientQuota  = "insufficient_quota"
	TypeServer             = "server_error"
	TypeServiceUnavailable = "service_unavailable_error"
)

// BadRequest is a 400 for malformed JSON or a missing or mistyped field.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: "invalid_request", Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// InvalidAPIKey is a 401 for a missing or unknown bearer key. It never echoes the key.
func InvalidAPIKey(missing bool) *Error {
	msg := "Incorrect API key provided."
	if missing {
		msg = "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'."
	}
	return &Error{Status: http.StatusUnauthorized, Type: TypeInvalidRequest, Code: "invalid_api_key", Message: msg}
}

// TooManyAuthFailures is a 429 for an unknown or missing API key from a client address that sent too many.
func TooManyAuthFailures(retry time.Duration) *Error {
	retry = max(retry, time.Second)
	return &Error{Status: http.StatusTooManyRequests, Type: TypeRateLimit, Code: "too_many_auth_failures",
		Message: "Too many requests with an invalid API key from your address; try again later with a valid key.",
		Header:  map[string]string{"retry-after": strconv.Itoa(int(math.Ceil(retry.Seconds())))}}
}

// ModelNotFound is a 404 for a model the policy does not define.
func ModelNotFound(model string) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)}
}

// ModelForbidden is a 403 for a model that exists but that this tenant may not call.
func ModelForbidden(model string) *Error {
	return &Error{Status: http.StatusForbidden, Type: TypePermission, Code: "model_not_allowed", Param: "model",
		Message: fmt.Sprintf("Your API key is not allowed to use the model `%s`.", model)}
}

// BodyTooLarge is a 413 for a request body over the gateway's limit.
func BodyTooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: "request_too_large",
		Message: fmt.Sprintf("The request body exceeds the gateway limit of %d bytes.", limit)}
}

// NotFound is a 404 for a path the gateway does not serve.
func NotFound(method, path string) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "unknown_url",
		Message: fmt.Sprintf("Unknown request URL: %s %s.", method, path)}
}

// MethodNotAllowed is a 405 for a known path called with the wrong method.
func MethodNotAllowed(method, path string) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed",
		Message: fmt.Sprintf("Method %s is not allowed on %s.", method, path)}
}

// NoCapacity is a 503 when no replica and no allowed fallback can take the request.
func NoCapacity(model string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServiceUnavailable, Code: "server_is_overloaded",
		Message: fmt.Sprintf("No capacity is available for the model `%s`; please try again later.", model)}
}

// OutsideResidency is a 503 for a tenant pinned to regions when nothing inside them can take the request (down
// or busy) and nothing outside may: it names the regions, so the client knows why the fleet's other capacity was
// not used. retry, when set, is when room may free up inside.
func OutsideResidency(model string, regions []string, retry time.Duration) *Error {
	hdr := map[string]string{"retry-after": "1"}
	if retry > 0 {
		hdr["retry-after"] = strconv.FormatInt(int64(math.Ceil(retry.Seconds())), 10)
	}
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServiceUnavailable, Code: "residency_unavailable", Header: hdr,
		Message: fmt.Sprintf("No capacity for the model `%s` is available within your data residency (%s), and requests are never served outside it; please try again later.",
			model, strings.Join(regions, ", "))}
}

// BodiesInFlight is a 503 for a request body that arrives while the gateway holds as many bytes of bodies not
// yet routed as it may: the client should retry shortly.
func BodiesInFlight() *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServiceUnavailable, Code: "request_bodies_in_flight",
		Header:  map[string]string{"retry-after": "1"},
		Message: "The gateway is holding as many request bodies as it may; please try again shortly."}
}

// Overloaded is a 429 when every replica of a model is saturated and no fallback may take the overflow: the
// client should retry after retry (when the admission queue measured how long it takes to drain; 0: shortly).
func Overloaded(model string, retry time.Duration) *Error {
	hdr := map[string]string{"retry-after": "1", "retry-after-ms": "500"}
	if retry > 0 {
		hdr = map[string]string{"retry-after": strconv.FormatInt(int64(math.Ceil(retry.Seconds())), 10),
			"retry-after-ms": strconv.FormatInt(retry.Milliseconds(), 10)}
	}
	return &Error{Status: http.StatusTooManyRequests, Type: TypeRateLimit, Code: "model_overloaded",
		Message: fmt.Sprintf("Every replica of the model `%s` is busy; please retry shortly.", model), Header: hdr}
}

// Internal is a 500 for a gateway fault; the message says what failed without leaking internals.
func Internal(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: TypeServer,
		Message: fmt.Sprintf(format, args...)}
}
