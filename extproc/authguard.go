package extproc

import (
	"net/netip"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/contract"
)

// Without a limit, ext_proc answers every guess at an API key with a plain 401 at full speed. authGuard counts
// failed authentications per client address (Envoy's source.address request attribute) in a token bucket; a
// source that spends its bucket has its failures answered with 429 until the bucket refills. Only failures are
// throttled: a valid key is looked up first and always goes on, since one address may stand for many clients
// (a NAT, a corporate proxy) and one of them guessing must not lock the others out. What keeps a key from
// being guessed is its randomness (docs/security.md: 32 random bytes or more); the throttle keeps a guesser from
// costing the gateway and its logs more than one failure a second, and says so in its metric.

const (
	// authFailureBurst is how many failed authentications a source may make at once.
	authFailureBurst = 20
	// authFailureRefill is how often one more is allowed: a steady guesser is held to one a second.
	authFailureRefill = time.Second
	// maxAuthSources bounds the sources remembered; past it, full buckets (sources that stopped failing) go.
	maxAuthSources = 100_000
)

type authGuard struct {
	mu      sync.Mutex
	buckets map[string]*authBucket
	now     func() time.Time
}

type authBucket struct {
	tokens float64
	at     time.Time
}

func newAuthGuard(now func() time.Time) *authGuard {
	if now == nil {
		now = time.Now
	}
	return &authGuard{buckets: map[string]*authBucket{}, now: now}
}

// refill brings a bucket up to date; g.mu is held.
func (g *authGuard) refill(b *authBucket, now time.Time) {
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(authFailureBurst, b.tokens+float64(elapsed)/float64(authFailureRefill))
		b.at = now
	}
}

// throttled reports whether source has no failed authentication left to spend, and when one comes back.
func (g *authGuard) throttled(source string) (bool, time.Duration) {
	if source == "" {
		return false, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.buckets[source]
	if !ok {
		return false, 0
	}
	now := g.now()
	g.refill(b, now)
	if b.tokens >= 1 {
		return false, 0
	}
	return true, time.Duration((1 - b.tokens) * float64(authFailureRefill))
}

// failed spends one failed authentication of source.
func (g *authGuard) failed(source string) {
	if source == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	b, ok := g.buckets[source]
	if !ok {
		if len(g.buckets) >= maxAuthSources {
			g.forgetFull(now)
		}
		b = &authBucket{tokens: authFailureBurst, at: now}
		g.buckets[source] = b
	}
	g.refill(b, now)
	b.tokens = max(0, b.tokens-1)
}

// forgetFull drops buckets that have refilled: those sources are not failing now. If every source is still
// failing (a spread attack), the oldest half of the map is dropped instead, so memory stays bounded.
func (g *authGuard) forgetFull(now time.Time) {
	for k, b := range g.buckets {
		g.refill(b, now)
		if b.tokens >= authFailureBurst {
			delete(g.buckets, k)
		}
	}
	for k := range g.buckets {
		if len(g.buckets) < maxAuthSources/2 {
			break
		}
		delete(g.buckets, k)
	}
}

// sourceOf reads the client's IP from the request attributes Envoy sends (request_attributes:
// [source.address]); "" when Envoy was not configured to send it.
func sourceOf(msg *extprocv3.ProcessingRequest) string {
	addr := msg.GetAttributes()[contract.AttributesKey].GetFields()[contract.SourceAddressAttribute].GetStringValue()
	if addr == "" || len(addr) > 64 {
		return ""
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr().Unmap().String()
	}
	if a, err := netip.ParseAddr(addr); err == nil {
		return a.Unmap().String()
	}
	return ""
}
