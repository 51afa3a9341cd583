package telemetry

import (
	"fmt"
	"net/netip"
	"strings"
)

// A client's traceparent makes a request's span its child, and under a parent-based sampler (the default) its
// sampled flag decides whether the request is traced: a client can have every request it sends traced, or
// none. ClientContext says whose context counts.
type ClientContext struct {
	// Mode is ClientContextHonour, ClientContextIgnore or ClientContextTrusted.
	Mode string
	// Trusted are the source addresses whose context counts under ClientContextTrusted (Envoy's
	// source.address: the client's, or a proxy's in front of Envoy).
	Trusted []netip.Prefix
}

// The client trace-context modes.
const (
	// ClientContextHonour: every client's traceparent is the span's parent (the OpenTelemetry default).
	ClientContextHonour = "honour"
	// ClientContextIgnore: every request starts a trace of its own and the sampler alone decides; the
	// client's context is kept as a span link, so its trace can still be found.
	ClientContextIgnore = "ignore"
	// ClientContextTrusted: honoured from the trusted addresses, ignored from any other.
	ClientContextTrusted = "trusted"
)

// ParseClientContext reads the --client-trace-context mode and the comma-separated --trace-trusted-sources
// (addresses or CIDR prefixes).
func ParseClientContext(mode, trusted string) (ClientContext, error) {
	c := ClientContext{Mode: mode}
	switch mode {
	case "", ClientContextHonour:
		c.Mode = ClientContextHonour
	case ClientContextIgnore, ClientContextTrusted:
	default:
		return c, fmt.Errorf("client trace context %q: want honour, ignore or trusted", mode)
	}
	for s := range strings.SplitSeq(trusted, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return c, fmt.Errorf("trusted trace source %q: not an address or a CIDR prefix", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		c.Trusted = append(c.Trusted, p.Masked())
	}
	if c.Mode == ClientContextTrusted && len(c.Trusted) == 0 {
		return c, fmt.Errorf("client trace context trusted needs trusted sources")
	}
	return c, nil
}

// honours reports whether a request from source (an IP, "" when Envoy sends none) keeps its client's context.
func (c ClientContext) honours(source string) bool {
	switch c.Mode {
	case ClientContextIgnore:
		return false
	case ClientContextTrusted:
		a, err := netip.ParseAddr(source)
		if err != nil {
			return false
		}
		for _, p := range c.Trusted {
			if p.Contains(a.Unmap()) {
				return true
			}
		}
		return false
	}
	return true
}
