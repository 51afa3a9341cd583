package extproc

import (
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// fromSource adds the source.address attribute Envoy sends with request_attributes: [source.address].
func fromSource(m *extprocv3.ProcessingRequest, addr string) *extprocv3.ProcessingRequest {
	m.Attributes = map[string]*structpb.Struct{contract.AttributesKey: {Fields: map[string]*structpb.Value{
		"source.address": structpb.NewStringValue(addr)}}}
	return m
}

// authStatus sends request headers with key from addr and returns the status of the answer (0 when the
// request went on to its body).
func authStatus(t *testing.T, h *harness, key, addr string) int {
	t.Helper()
	s := h.open(t, modeBuffered, modeNone)
	m := postHeaders("/v1/chat/completions", key)
	if addr != "" {
		m = fromSource(m, addr)
	}
	s.send(m)
	r := s.recv()
	if r.GetImmediateResponse() == nil {
		return 0
	}
	status, _ := immediateError(t, r)
	return status
}

// A source that guesses keys is held to one guess a second after a burst; a valid key from the same address
// (another client behind the same NAT) still goes on, and other sources are not affected.
func TestFailedAuthenticationsAreLimitedPerSource(t *testing.T) {
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	h := newHarnessWith(t, snap, config{Options: Options{Now: clock.Now}})
	const attacker = "203.0.113.5:40001"
	for i := range authFailureBurst {
		if st := authStatus(t, h, "sk-guess-"+string(rune('a'+i)), attacker); st != 401 {
			t.Fatalf("guess %d: status %d, want 401", i, st)
		}
	}
	if st := authStatus(t, h, "sk-guess-more", "203.0.113.5:40002"); st != 429 {
		t.Errorf("guess past the burst (another port, same address): %d, want 429", st)
	}
	if st := authStatus(t, h, keyAcme, attacker); st != 0 {
		t.Errorf("a valid key from the throttled address: %d, want routed on", st)
	}
	if st := authStatus(t, h, "sk-typo", "198.51.100.7:5000"); st != 401 {
		t.Errorf("another source: %d, want 401", st)
	}
	if st := authStatus(t, h, keyAcme, "198.51.100.7:5000"); st != 0 {
		t.Errorf("a valid key from another source: %d, want routed on", st)
	}
	clock.Advance(authFailureRefill)
	if st := authStatus(t, h, "sk-guess-later", attacker); st != 401 {
		t.Errorf("one guess a second later: %d, want 401", st)
	}
	if st := authStatus(t, h, "sk-guess-again", attacker); st != 429 {
		t.Errorf("a second guess in the same second: %d, want 429", st)
	}
	// Without the attribute (Envoy not configured to send it) nothing is limited.
	for range authFailureBurst + 5 {
		if st := authStatus(t, h, "sk-anon", ""); st != 401 {
			t.Fatalf("no source: %d, want 401", st)
		}
	}
}

func TestAuthGuardMemoryIsBounded(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	g := newAuthGuard(clock.Now)
	for i := range maxAuthSources + 10 {
		g.failed(string(rune(i)) + "x")
	}
	if n := len(g.buckets); n > maxAuthSources {
		t.Errorf("%d sources remembered, bound %d", n, maxAuthSources)
	}
}

func TestSourceOf(t *testing.T) {
	for addr, want := range map[string]string{
		"203.0.113.5:443": "203.0.113.5", "[2001:db8::1]:443": "2001:db8::1", "10.0.0.1": "10.0.0.1",
		"not an address": "", "": "", "203.0.113.5:443\r\nx": "",
	} {
		if got := sourceOf(fromSource(&extprocv3.ProcessingRequest{}, addr)); got != want {
			t.Errorf("sourceOf(%q) = %q, want %q", addr, got, want)
		}
	}
}
