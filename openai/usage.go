package openai

import (
	"bytes"

	"github.com/buger/jsonparser"
)

// Usage is the token count an engine reports for one request; it is what quotas settle and cost is billed on.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
	CachedTokens     int64 // prompt_tokens_details.cached_tokens: prompt tokens served from KV cache
}

// Total is prompt plus completion tokens.
func (u Usage) Total() int64 { return u.PromptTokens + u.CompletionTokens }

var usagePaths = [][]string{
	{"prompt_tokens"},
	{"completion_tokens"},
	{"prompt_tokens_details", "cached_tokens"},
}

// parseUsageObject reads a "usage" object; ok is false when it holds no token counts.
func parseUsageObject(obj []byte) (u Usage, ok bool) {
	jsonparser.EachKey(obj, func(idx int, value []byte, vt jsonparser.ValueType, err error) {
		if err != nil || vt != jsonparser.Number {
			return
		}
		n, perr := jsonparser.ParseInt(value)
		if perr != nil || n < 0 {
			return
		}
		ok = true
		switch idx {
		case 0:
			u.PromptTokens = n
		case 1:
			u.CompletionTokens = n
		case 2:
			u.CachedTokens = n
		}
	}, usagePaths...)
	return u, ok
}

// UsageFromJSON reads the usage of a non-streaming response body.
func UsageFromJSON(body []byte) (Usage, bool) {
	obj, vt, _, err := jsonparser.Get(body, "usage")
	if err != nil || vt != jsonparser.Object {
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
	pending  []byte // start of an event whose end has not arrived yet
}

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
	case end || len(rest) > maxPendingEvent:
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
		out = append(out, rest...)
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
		obj, vt, _, err := jsonparser.Get(payload, "usage")
		if err != nil || vt != jsonparser.Object {
			continue
		}
		if u, ok := parseUsageObject(obj); ok {
			s.usage, s.sawUsage = u, true
			if s.DropUsageChunk && emptyChoices(payload) {
				drop = true
			}
		}
	}
	return drop
}

func emptyChoices(payload []byte) bool {
	v, vt, _, err := jsonparser.Get(payload, "choices")
	if err != nil || vt != jsonparser.Array {
		return false
	}
	return len(bytes.TrimSpace(v[1:len(v)-1])) == 0
}
