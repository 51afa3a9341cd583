package extproc

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
	"github.com/infergate/infergate/test/redistest"
)

// quotaHarness serves testdata/policy.yaml with acme's quota replaced, and quotas in a real redis-server.
func quotaHarness(t *testing.T, acmeQuota, settings string) (*harness, *redistest.Server) {
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
	return newHarnessWith(t, snap, Options{Quotas: quota.New(ctx, quota.Options{Addrs: []string{srv.Addr}})}), srv
}

// sendChat opens a BUFFERED stream and sends a chat request; it returns the stream and the body answer.
func sendChat(t *testing.T, h *harness) (*stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	return post(t, h, keyAcme, chatBody, modeBuffered)
}

func TestQuotaRejectionIsOpenAI429(t *testing.T) {
	h, _ := quotaHarness(t, "requestsPerSecond: 2", "redisTimeout: 2s")
	// Windows are whole seconds on the real clock: start just after a boundary so that the three
	// requests (tens of milliseconds) share one window.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, r := sendChat(t, h)
		if r.GetRequestBody() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the aborted request's slot was never freed")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := srv.Do("EVAL", "local s = 0 for _, k in ipairs(redis.call('KEYS', '*tpm*')) do s = s + tonumber(redis.call('GET', k)) end return s", "0")
		if err == nil && v == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tokens counter %q (%v) after an upstream error, want the reservation refunded", v, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
