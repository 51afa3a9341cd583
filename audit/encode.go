package audit

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// appendLine appends r as one JSON line, as encoding/json would write it (same keys, order and omissions, HTML
// left unescaped), at a fraction of reflection's cost: the writer encodes every request the gateway serves.
func appendLine(b []byte, r *Record) []byte {
	b = append(b, `{"time":"`...)
	b = r.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","request_id":`...)
	b = appendString(b, r.RequestID)
	if r.TraceID != "" {
		b = append(b, `,"trace_id":`...)
		b = appendString(b, r.TraceID)
	}
	b = append(b, `,"tenant":`...)
	b = appendString(b, r.Tenant)
	b = appendOptional(b, `,"tier":`, r.Tier)
	b = append(b, `,"model":`...)
	b = appendString(b, r.Model)
	b = appendOptional(b, `,"pool":`, r.Pool)
	b = appendOptional(b, `,"endpoint":`, r.Endpoint)
	b = appendOptional(b, `,"prefill_endpoint":`, r.PrefillEndpoint)
	if r.PrefillFailed {
		b = append(b, `,"prefill_failed":true`...)
	}
	b = appendOptional(b, `,"prompt_hmac":`, r.PromptDigest)
	b = appendOptional(b, `,"output_hmac":`, r.OutputDigest)
	b = appendOptional(b, `,"digest_key":`, r.DigestKey)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, r.PromptTokens, 10)
	b = append(b, `,"cached_tokens":`...)
	b = strconv.AppendInt(b, r.CachedTokens, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, r.CompletionTokens, 10)
	b = append(b, `,"cost_usd":`...)
	b = appendFloat(b, r.CostUSD)
	b = append(b, `,"ttft_ms":`...)
	b = appendFloat(b, r.TTFTMillis)
	b = append(b, `,"e2e_ms":`...)
	b = appendFloat(b, r.E2EMillis)
	if r.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
	}
	b = append(b, `,"outcome":`...)
	b = appendString(b, r.Outcome)
	b = append(b, `,"good":`...)
	b = strconv.AppendBool(b, r.Good)
	if r.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	return append(b, "}\n"...)
}

func appendOptional(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return appendString(append(b, key...), v)
}

// appendFloat writes a finite float as encoding/json does: the shortest representation, in exponent form
// below 1e-6 and from 1e21 on.
func appendFloat(b []byte, f float64) []byte {
	abs := f
	if abs < 0 {
		abs = -abs
	}
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// encoding/json writes e-07, not e-7's Go form with two digits: clean up e-0X to e-X.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string the way encoding/json does with HTML escaping off: quotes,
// backslashes and control characters escaped, invalid UTF-8 replaced by U+FFFD, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(append(b, s[start:]...), '"')
}
