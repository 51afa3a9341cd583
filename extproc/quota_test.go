package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/test/redistest"
	"github.com/infergate/infergate/test/wait"
)

// quotaHarness serves testdata/policy.yaml with acme's quota replaced, and quotas in a real redis-server.
func quotaHarness(t *testing.T, acmeQuota, settings string) (*harness, *redistest.Server) {
	t.Helper()
	return quotaHarnessAt(t, acmeQuota, settings, nil)
}

// quotaHarnessAt is quotaHarness with the quota stage on a given clock (nil: the real one).
func quotaHarnessAt(t *testing.T, acmeQuota, settings string, now func() time.Time) (*harness, *redistest.Server) {
	t.Helper()
	src, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), `    models: ["*"]`, `    models: ["*"]
    quota: {`+acmeQuota+`}`, 1)
	text = strings.Replace(text, "spec:\n", "spec:\n  quotas: {"+settings+"}\n", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return newHarnessWith(t, snap, config{Director: director.Options{Admission: quota.New(ctx, quota.Options{Addrs: []string{srv.Addr}, Now: now})}}), srv
}

// sendChat opens a BUFFERED stream and sends a chat request; it returns the stream and the body answer.
func sendChat(t *testing.T, h *harness) (*stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	return post(t, h, keyAcme, chatBody, modeBuffered)
}

func TestQuotaRejectionIsOpenAI429(t *testing.T) {
	// A fixed clock keeps the three requests in one one-second window.
	now := time.Date(2026, 12, 1, 10, 0, 0, 100e6, time.UTC)
	h, _ := quotaHarnessAt(t, "requestsPerSecond: 2", "redisTimeout: 2s", func() time.Time { return now })
	for i := range 2 {
		if _, r := sendChat(t, h); r.GetRequestBody() == nil {
			t.Fatalf("request %d not routed: %v", i, r)
		}
	}
	_, r := sendChat(t, h)
	status, code := immediateError(t, r)
	if status != 429 || code != "rate_limit_exceeded" {
		t.Fatalf("got %d %q", status, code)
	}
	hdr := setHeaders(r.GetImmediateResponse().GetHeaders())
	if hdr["x-ratelimit-limit-requests"] != "2" || hdr["x-ratelimit-remaining-requests"] != "0" || hdr["retry-after"] != "1" || hdr["x-ratelimit-reset-requests"] == "" {
		t.Errorf("rate-limit headers %v", hdr)
	}
	var env struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	_ = json.Unmarshal(r.GetImmediateResponse().GetBody(), &env)
	if env.Error.Type != "requests" || !strings.Contains(env.Error.Message, "requests per second") {
		t.Errorf("error %+v", env.Error)
	}
}

// A client abort settles the reservation: the concurrency slot frees and the next request is admitted.
func TestQuotaSettledOnAbort(t *testing.T) {
	h, _ := quotaHarness(t, "maxConcurrent: 1", "redisTimeout: 2s")
	s, r := sendChat(t, h)
	if r.GetRequestBody() == nil {
		t.Fatal("first request not routed")
	}
	if _, r := sendChat(t, h); r.GetImmediateResponse() == nil {
		t.Fatal("second concurrent request admitted over maxConcurrent 1")
	}
	s.cancel() // client gone
	h.settlement()
	wait.For(t, "the aborted request's slot to be freed", func() bool {
		_, r := sendChat(t, h)
		return r.GetRequestBody() != nil
	})
}

// An upstream error refunds the reservation: the tokens counter goes back to zero. (Leases off: with them the
// refund stays in this gateway's slice until it is handed back, which quota's own tests cover.)
func TestQuotaRefundOnUpstreamError(t *testing.T) {
	h, srv := quotaHarness(t, "tokensPerMinute: 100000", "redisTimeout: 2s, leaseFraction: 0")
	s, _ := sendChat(t, h)
	s.send(respHeaders("503", false))
	s.recv()
	s.send(respBody([]byte(`{"error":{"message":"overloaded"}}`), true))
	s.recv()
	h.settlement()
	wait.For(t, "the reservation refunded after an upstream error", func() bool {
		v, err := srv.Do("EVAL", "local s = 0 for _, k in ipairs(redis.call('KEYS', '*tpm*')) do s = s + tonumber(redis.call('GET', k)) end return s", "0")
		return err == nil && v == "0"
	})
}

func TestQuotaFailClosedIs503(t *testing.T) {
	h, srv := quotaHarness(t, "requestsPerSecond: 100", "failMode: closed, redisTimeout: 100ms")
	srv.Kill()
	_, r := sendChat(t, h)
	status, code := immediateError(t, r)
	if status != 503 || code != "quota_unavailable" {
		t.Errorf("got %d %q", status, code)
	}
}

// Requests without max_tokens to an engine whose own default output (600 tokens) is larger than the policy's
// defaultMaxTokens (256): the gateway writes the bound it reserved into the body, so an engine that honours
// max_tokens can never push a tokens-per-minute limit past itself.
func TestTokensPerMinuteHoldWithoutMaxTokens(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)
	h, _ := quotaHarnessAt(t, "tokensPerMinute: 5000", "redisTimeout: 2s, leaseFraction: 0", func() time.Time { return now })
	const engineDefault = 600
	body := `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"write me a long story"}],"stream":false}`
	var used int64
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("never rejected")
		}
		s, r := post(t, h, keyAcme, body, modeBuffered)
		if r.GetImmediateResponse() != nil {
			if status, _ := immediateError(t, r); status != 429 {
				t.Fatalf("status %d", status)
			}
			break
		}
		// The engine: its default output unless the body bounds it.
		sent := r.GetRequestBody().GetResponse().GetBodyMutation().GetBody()
		if sent == nil {
			sent = []byte(body)
		}
		var req struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		_ = json.Unmarshal(sent, &req)
		completion := int64(engineDefault)
		if req.MaxTokens > 0 {
			completion = min(completion, req.MaxTokens)
		}
		prompt := int64(len(body)/4 + 1)
		s.send(respHeaders("200", false, "content-type", "application/json"))
		s.recv()
		s.send(respBody([]byte(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion)), true))
		s.recv()
		h.settlement()
		used += prompt + completion
	}
	if used > 5000 {
		t.Errorf("served %d tokens under a 5000 tokens-per-minute limit", used)
	}
	if used < 4000 {
		t.Errorf("served only %d of 5000 tokens", used)
	}
}

// A request whose own estimate exceeds the limit gets a 429 that clients' SDKs do not retry.
func TestRequestOverTheLimitItselfIsNotRetryable(t *testing.T) {
	h, _ := quotaHarness(t, "tokensPerMinute: 20000", "redisTimeout: 2s, leaseFraction: 0")
	_, r := post(t, h, keyAcme, `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"x"}],"max_tokens":100000}`, modeBuffered)
	status, _ := immediateError(t, r)
	hdr := setHeaders(r.GetImmediateResponse().GetHeaders())
	if status != 429 || hdr["x-should-retry"] != "false" || hdr["retry-after"] != "" {
		t.Errorf("status %d headers %v", status, hdr)
	}
}

// A successful response carries the tenant's remaining budget in OpenAI's x-ratelimit-* headers, as every
// OpenAI response does.
func TestSuccessfulResponsesCarryTheBudget(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 400e6, time.UTC)
	h, _ := quotaHarnessAt(t, "requestsPerSecond: 5, tokensPerMinute: 100000", "redisTimeout: 2s, leaseFraction: 0",
		func() time.Time { return now })
	for i, want := range []string{"4", "3"} {
		s, r := sendChat(t, h)
		if r.GetRequestBody() == nil {
			t.Fatalf("request %d not routed: %v", i, r)
		}
		s.send(respHeaders("200", false, "content-type", "application/json"))
		hdr := setHeaders(s.recv().GetResponseHeaders().GetResponse().GetHeaderMutation())
		if hdr["x-ratelimit-limit-requests"] != "5" || hdr["x-ratelimit-remaining-requests"] != want ||
			hdr["x-ratelimit-reset-requests"] != "600ms" || hdr["x-ratelimit-limit-tokens"] != "100000" ||
			hdr["x-ratelimit-remaining-tokens"] == "" || hdr["x-ratelimit-reset-tokens"] != "59.6s" {
			t.Errorf("request %d: rate-limit headers %v", i, hdr)
		}
		s.send(respBody([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`), true))
		s.recv()
		h.settlement()
	}
}
