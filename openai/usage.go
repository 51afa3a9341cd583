package openai

import (
	"bytes"
	"math"

	"github.com/valyala/fastjson"
)

// Usage is the token count an engine reports for one request; it is what quotas settle and cost is billed on.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64 // prompt_tokens_details.cached_tokens: prompt tokens served from KV cache
	// CachedReported is whether the engine reported cached_tokens at all (vLLM does only with
	// --enable-prompt-tokens-details): a zero that was never reported is not a cache miss.
	CachedReported bool
}

// Total is prompt plus completion tokens, saturating rather than wrapping.
func (u Usage) Total() int64 {
	if u.PromptTokens > math.MaxInt64-u.CompletionTokens {
		return math.MaxInt64
	}
	return u.PromptTokens + u.CompletionTokens
}

// Clamp bounds every count by limit — what one request can really use, such as the model's context — and
// reports whether anything was cut: an upstream's usage is outside input, and a count near 2^63 must not
// reach spend and quota arithmetic.
func (u Usage) Clamp(limit int64) (Usage, bool) {
	cut := u.PromptTokens > limit || u.CompletionTokens > limit || u.CachedTokens > limit
	u.PromptTokens, u.CompletionTokens, u.CachedTokens = min(u.PromptTokens, limit), min(u.CompletionTokens, limit), min(u.CachedTokens, limit)
	return u, cut
}

// parseUsageObject reads a "usage" object; ok is false when it holds no token counts.
func parseUsageObject(obj *fastjson.Value) (u Usage, ok bool) {
	count := func(v *fastjson.Value) int64 {
		if v == nil || v.Type() != fastjson.TypeNumber {
			return 0
		}
		n, err := v.Int64()
		if err != nil || n < 0 {
			return 0
		}
		ok = true
		return n
	}
	u.PromptTokens = count(obj.Get("prompt_tokens"))
	u.CompletionTokens = count(obj.Get("completion_tokens"))
	cached := obj.Get("prompt_tokens_details", "cached_tokens")
	u.CachedTokens, u.CachedReported = count(cached), cached != nil && cached.Type() == fastjson.TypeNumber
	return u, ok
}

// UsageFromJSON reads the usage of a non-streaming response body.
func UsageFromJSON(body []byte) (Usage, bool) {
	p := parsers.Get()
	defer parsers.Put(p)
	doc, err := p.ParseBytes(body)
	if err != nil {
		return Usage{}, false
	}
	obj := doc.Get("usage")
	if obj == nil || obj.Type() != fastjson.TypeObject {
		return Usage{}, false
	}
	return parseUsageObject(obj)
}

// maxPendingEvent bounds how much of one unfinished SSE event is held across chunks; an event larger than this
// is passed through unparsed rather than buffered without limit.
const maxPendingEvent = 1 << 20

// SSEScanner follows a server-sent-events response chunk by chunk, across arbitrary chunk boundaries, and
// records the token usage it reports. With DropUsageChunk it also removes the usage-only event (empty
// "choices") that the gateway asked for on the client's behalf, so the client sees the stream it asked for.
type SSEScanner struct {
	DropUsageChunk bool

	usage    Usage
	sawUsage bool
	content  int64  // events with choices: about one output token each
	pending  []byte // start of an event whose end has not arrived yet
}

// ContentEvents counts events that carried choices, an estimate of output tokens when usage never came.
func (s *SSEScanner) ContentEvents() int64 { return s.content }

// Usage returns the last usage the stream reported.
func (s *SSEScanner) Usage() (Usage, bool) { return s.usage, s.sawUsage }

// Process consumes one chunk and returns the bytes to forward in its place. Without DropUsageChunk the chunk
// is returned unchanged. With it, a trailing partial event is held back and forwarded with the chunk that
// completes it; end flushes whatever is held.
func (s *SSEScanner) Process(chunk []byte, end bool) []byte {
	if !s.DropUsageChunk {
		s.scan(chunk, end)
		return chunk
	}
	return s.filter(chunk, end)
}

// scan parses events without changing the stream, carrying an unfinished event over to the next chunk.
func (s *SSEScanner) scan(chunk []byte, end bool) {
	data := chunk
	if len(s.pending) > 0 {
		s.pending = append(s.pending, chunk...)
		data = s.pending
	}
	rest := s.eachEvent(data, nil)
	switch {
	case end:
		s.event(rest) // a last event the server did not close with a blank line
		s.pending = s.pending[:0]
	case len(rest) > maxPendingEvent:
		s.pending = s.pending[:0]
	case len(s.pending) > 0:
		s.pending = s.pending[:copy(s.pending, rest)] // rest is a suffix of pending; copy handles the overlap
	default:
		s.pending = append(s.pending, rest...)
	}
}

// filter parses events and returns the chunk with dropped events removed and a partial tail held back.
func (s *SSEScanner) filter(chunk []byte, end bool) []byte {
	data := chunk
	if len(s.pending) > 0 {
		data = append(s.pending, chunk...)
		s.pending = nil
	}
	out := make([]byte, 0, len(data))
	rest := s.eachEvent(data, &out)
	if end || len(rest) > maxPendingEvent {
		if end && !s.event(rest) {
			out = append(out, rest...)
		} else if !end {
			out = append(out, rest...)
		}
		s.pending = nil
		return out
	}
	s.pending = append(s.pending[:0], rest...)
	return out
}

// eachEvent handles every complete event in data, appending kept events to out when out is not nil, and
// returns the incomplete remainder.
func (s *SSEScanner) eachEvent(data []byte, out *[]byte) []byte {
	for {
		n, sep := eventEnd(data)
		if n < 0 {
			return data
		}
		event := data[:n+sep]
		if drop := s.event(data[:n]); !drop && out != nil {
			*out = append(*out, event...)
		}
		data = data[n+sep:]
	}
}

// eventEnd finds the blank line that ends the first event: its index and the separator length.
func eventEnd(data []byte) (int, int) {
	for i := 0; i < len(data); i++ {
		if data[i] != '\n' {
			continue
		}
		if i+1 < len(data) && data[i+1] == '\n' {
			return i, 2
		}
		if i+2 < len(data) && data[i+1] == '\r' && data[i+2] == '\n' {
			return i, 3
		}
	}
	return -1, 0
}

var dataPrefix = []byte("data:")

// event parses one event's lines and reports whether it should be dropped.
func (s *SSEScanner) event(ev []byte) (drop bool) {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimRight(line, "\r")
		payload, ok := bytes.CutPrefix(line, dataPrefix)
		if !ok {
			continue
		}
		payload = bytes.TrimLeft(payload, " ")
		if len(payload) == 0 || payload[0] != '{' {
			continue // [DONE] and keep-alives
		}
		s.eventJSON(payload, &drop)
	}
	return drop
}

// eventJSON reads one data payload: its usage, and whether it is the usage-only chunk to drop.
func (s *SSEScanner) eventJSON(payload []byte, drop *bool) {
	p := parsers.Get()
	defer parsers.Put(p)
	doc, err := p.ParseBytes(payload)
	if err != nil {
		return
	}
	if choices := doc.Get("choices"); choices != nil && choices.Type() == fastjson.TypeArray && len(choices.GetArray()) > 0 {
		s.content++
	}
	obj := doc.Get("usage")
	if obj == nil || obj.Type() != fastjson.TypeObject {
		return
	}
	u, ok := parseUsageObject(obj)
	if !ok {
		return
	}
	s.usage, s.sawUsage = u, true
	if s.DropUsageChunk {
		if choices := doc.Get("choices"); choices != nil && choices.Type() == fastjson.TypeArray && len(choices.GetArray()) == 0 {
			*drop = true
		}
	}
}
