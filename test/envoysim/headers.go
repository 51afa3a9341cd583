package envoysim

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http/httpguts"
)

// headerMap is an HTTP/2-style header list: lower-case keys, pseudo-headers first, order kept.
type headerMap struct {
	kv []kv
}

type kv struct{ k, v string }

func (h *headerMap) get(k string) (string, bool) {
	for _, e := range h.kv {
		if e.k == k {
			return e.v, true
		}
	}
	return "", false
}

func (h *headerMap) value(k string) string { v, _ := h.get(k); return v }

func (h *headerMap) add(k, v string) { h.kv = append(h.kv, kv{k, v}) }

// set replaces every value of k with v.
func (h *headerMap) set(k, v string) {
	h.del(k)
	h.add(k, v)
}

func (h *headerMap) del(k string) {
	out := h.kv[:0]
	for _, e := range h.kv {
		if e.k != k {
			out = append(out, e)
		}
	}
	h.kv = out
}

// proto renders the headers as Envoy sends them: lower-case keys, values in raw_value, filtered by the
// forward rules (disallowed wins over allowed).
func (h *headerMap) proto(rules *headerForwardRules) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for _, e := range h.kv {
		if !rules.allows(e.k) {
			continue
		}
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: e.k, RawValue: []byte(e.v)})
	}
	return out
}

type headerForwardRules struct {
	allowed, disallowed func(string) bool
}

func (r *headerForwardRules) allows(k string) bool {
	if r == nil {
		return true
	}
	if r.disallowed != nil && r.disallowed(k) {
		return false
	}
	return r.allowed == nil || r.allowed(k)
}

// Limits on headers, as the HCM enforces them.
const (
	maxHeaderCount = 100
	maxHeadersKiB  = 60
)

// mutationOp is what the checker is asked about.
type mutationOp int

const (
	opSet mutationOp = iota
	opAppend
	opRemove
)

// errMutation is a rejected mutation under disallow_is_error, or a malformed one: the filter answers
// status_on_error.
var errMutation = errors.New("header mutation rejected")

// checker implements Envoy's mutation rules (mutation_rules.cc), in their order.
type checker struct {
	rules             *mutationrulesv3.HeaderMutationRules
	allowExp, denyExp *regexp.Regexp
	rejected          int // counter rejected_header_mutations
}

func newChecker(rules *mutationrulesv3.HeaderMutationRules) (*checker, error) {
	c := &checker{rules: rules}
	var err error
	if re := rules.GetAllowExpression().GetRegex(); re != "" {
		if c.allowExp, err = regexp.Compile("^(?:" + re + ")$"); err != nil {
			return nil, fmt.Errorf("allow_expression: %w", err)
		}
	}
	if re := rules.GetDisallowExpression().GetRegex(); re != "" {
		if c.denyExp, err = regexp.Compile("^(?:" + re + ")$"); err != nil {
			return nil, fmt.Errorf("disallow_expression: %w", err)
		}
	}
	return c, nil
}

// allowed applies the checker order (docs/architecture.md, E4).
func (c *checker) allowed(op mutationOp, key string) bool {
	r := c.rules
	switch {
	case c.denyExp != nil && c.denyExp.MatchString(key):
		return false
	case c.allowExp != nil && c.allowExp.MatchString(key):
		return true
	case r.GetDisallowAll().GetValue():
		return false
	}
	if !r.GetAllowAllRouting().GetValue() {
		switch key {
		case "host", ":authority", ":method", ":scheme":
			return false
		}
	}
	if strings.HasPrefix(key, ":") && (op == opAppend || r.GetDisallowSystem().GetValue()) {
		return false
	}
	if strings.HasPrefix(key, "x-envoy-") && !r.GetAllowEnvoy().GetValue() {
		return false
	}
	return true
}

// deny records a rejected mutation: an error with disallow_is_error, otherwise ignored and counted.
func (c *checker) deny(what string) error {
	if c.rules.GetDisallowIsError().GetValue() {
		return fmt.Errorf("%w: %s", errMutation, what)
	}
	c.rejected++
	return nil
}

func validValue(key, v string) bool {
	switch key {
	case ":authority", "host":
		return v != "" && httpguts.ValidHostHeader(v)
	case ":scheme":
		return v == "http" || v == "https"
	case ":status":
		n, err := strconv.Atoi(v)
		return err == nil && n >= 200
	}
	return httpguts.ValidHeaderFieldValue(v)
}

func validName(key string) bool {
	if strings.HasPrefix(key, ":") {
		return len(key) > 1 && httpguts.ValidHeaderFieldName(key[1:])
	}
	return httpguts.ValidHeaderFieldName(key)
}

// applyMutation applies a HeaderMutation as MutationUtils::applyHeaderMutations does. dropContentLength is
// set when the current mode removes content-length, in which case setting it is silently skipped.
// replaceAllowsMethod is the CONTINUE_AND_REPLACE exception for :method.
func (c *checker) applyMutation(h *headerMap, hm *extprocv3.HeaderMutation, dropContentLength, replaceAllowsMethod bool) error {
	if hm == nil {
		return nil
	}
	if len(hm.GetRemoveHeaders()) > maxHeaderCount || len(hm.GetSetHeaders()) > maxHeaderCount {
		return fmt.Errorf("%w: too many headers in mutation", errMutation)
	}
	for _, name := range hm.GetRemoveHeaders() {
		key := strings.ToLower(name)
		if !validName(key) {
			return fmt.Errorf("%w: invalid header name %q", errMutation, name)
		}
		// Removing host or a pseudo-header is never allowed, whatever the rules.
		if key == "host" || strings.HasPrefix(key, ":") || !c.allowed(opRemove, key) {
			if err := c.deny("remove " + key); err != nil {
				return err
			}
			continue
		}
		h.del(key)
	}
	for _, opt := range hm.GetSetHeaders() {
		hv := opt.GetHeader()
		key := strings.ToLower(hv.GetKey())
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return fmt.Errorf("%w: both value and raw_value set for %q", errMutation, key)
		}
		// With send_header_raw_value (the default) only raw_value is read: value alone gives an empty header.
		val := string(hv.GetRawValue())
		if !validName(key) || !validValue(key, val) {
			if key == ":authority" || key == "host" || key == ":scheme" || key == ":status" {
				if err := c.deny("invalid value for " + key); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("%w: invalid header %q", errMutation, key)
		}
		if key == "content-length" && dropContentLength {
			continue
		}
		// Only the deprecated BoolValue append is read; default false means overwrite.
		//lint:ignore SA1019 Envoy's ext_proc reads exactly this deprecated field (docs/architecture.md, E4), so the emulator must too.
		appendVal := opt.GetAppend().GetValue()
		_, exists := h.get(key)
		op := opSet
		if appendVal && exists {
			op = opAppend
		}
		ok := c.allowed(op, key)
		if !ok && replaceAllowsMethod && key == ":method" {
			ok = true
		}
		if !ok {
			if err := c.deny("set " + key); err != nil {
				return err
			}
			continue
		}
		if op == opAppend {
			h.add(key, val)
		} else {
			h.set(key, val)
		}
	}
	if len(h.kv) > maxHeaderCount {
		return fmt.Errorf("%w: header count over the limit", errMutation)
	}
	size := 0
	for _, e := range h.kv {
		size += len(e.k) + len(e.v)
	}
	if size > maxHeadersKiB<<10 {
		return fmt.Errorf("%w: headers over the size limit", errMutation)
	}
	return nil
}
