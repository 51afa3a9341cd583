package openai

import (
	"bytes"
	"io"
	"math"

	"github.com/valyala/fastjson"
)

// parsers parse the engines' JSON responses (bounded by the response body limit, and from the fleet).
var parsers fastjson.ParserPool

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
// the output by limit for each of choices sequences (n), and reports whether anything was cut: an upstream's
// usage is outside input, and a count near 2^63 must not reach spend and quota arithmetic.
func (u Usage) Clamp(limit, choices int64) (Usage, bool) {
	out := limit
	if choices > 1 && limit <= math.MaxInt64/choices {
		out = limit * choices
	}
	cut := u.PromptTokens > limit || u.CompletionTokens > out || u.CachedTokens > limit
	u.PromptTokens, u.CompletionTokens, u.CachedTokens = min(u.PromptTokens, limit), min(u.CompletionTokens, out), min(u.CachedTokens, limit)
	return u, cut
}

// parseUsageObject reads a "usage" object; ok is false when it holds no token counts.
func parseUsageObject(obj *fastjson.Value) (u Usage, ok bool) {
	count := func(v *fastjson.Value) (int64, bool) {
		if v == nil || v.Type() != fastjson.TypeNumber {
			return 0, false
		}
		n, err := v.Int64()
		if err != nil || n < 0 {
			return 0, false
		}
		return n, true
	}
	// Chat and completions name them prompt and completion; the Responses API input and output.
	var okPrompt, okCompletion bool
	if u.PromptTokens, okPrompt = count(obj.Get("prompt_tokens")); !okPrompt {
		u.PromptTokens, okPrompt = count(obj.Get("input_tokens"))
	}
	if u.CompletionTokens, okCompletion = count(obj.Get("completion_tokens")); !okCompletion {
		u.CompletionTokens, okCompletion = count(obj.Get("output_tokens"))
	}
	if u.CachedTokens, u.CachedReported = count(obj.Get("prompt_tokens_details", "cached_tokens")); !u.CachedReported {
		u.CachedTokens, u.CachedReported = count(obj.Get("input_tokens_details", "cached_tokens"))
	}
	if !okPrompt && !okCompletion && !u.CachedReported {
		return Usage{}, false
	}
	return u, true
}

// UsageFromJSON reads the usage of a non-streaming response body.
func UsageFromJSON(body []byte) (Usage, bool) {
	u, ok, _ := AnswerFromJSON(body)
	return u, ok
}

// AnswerFromJSON reads a non-streaming response body once for what settlement needs of it: its usage (ok false
// without one) and its finish reason (see FinishReason).
func AnswerFromJSON(body []byte) (u Usage, ok bool, finish string) {
	p := parsers.Get()
	defer parsers.Put(p)
	doc, err := p.ParseBytes(body)
	if err != nil {
		return Usage{}, false, ""
	}
	finish = docFinish(doc)
	if obj := doc.Get("usage"); obj != nil && obj.Type() == fastjson.TypeObject {
		u, ok = parseUsageObject(obj)
	}
	return u, ok, finish
}

// maxPendingLine bounds how much of one unfinished SSE line is held across chunks; a longer line is passed
// through unparsed rather than buffered without limit.
const maxPendingLine = 1 << 20

// SSEScanner follows a server-sent-events response chunk by chunk, across arbitrary chunk boundaries, and
// records the token usage it reports. With DropUsageChunk it also removes the usage-only event (empty
// "choices") that the gateway asked for on the client's behalf, so the client sees the stream it asked for.
//
// It works line by line, so a malformed stream (data lines with no blank line between events) still flows
// through as it arrives: only a usage-only data line that is an event of its own — first line of its event,
// followed by a blank line or the end of the stream — is ever removed, and at most that one line is held
// back while the scanner waits to see which it is.
type SSEScanner struct {
	DropUsageChunk bool
	// RenameModel, when set, replaces the value of every event's "model" with it: a JSON string, quotes
	// included (see AppendRenamedModel).
	RenameModel []byte
	// Text, when set, receives the generated text of every event (the choices' delta.content or text, in
	// order), for a digest of what the model produced.
	Text io.Writer

	usage    Usage
	sawUsage bool
	content  int64  // data lines with choices: about one output token each
	pending  []byte // start of a line whose end has not arrived yet
	tooLong  bool   // pending overflowed: the rest of this line passes unparsed
	held     []byte // a usage-only data line waiting for the blank line that makes it droppable
	midEvent bool   // a line other than a blank one has been seen since the last event ended
	complete bool   // the stream's terminal event passed
	finish   string // the first finish reason a choice reported (a constant of finish.go)
}

// Complete reports whether the stream's terminal event passed: `data: [DONE]` (chat and completions) or a
// Responses API response.completed, response.incomplete or response.failed. After it the client holds the
// whole answer, so a connection closed before the body's last empty chunk is not a cut-short response.
func (s *SSEScanner) Complete() bool { return s.complete }

// ContentEvents counts events that carried choices, an estimate of output tokens when usage never came.
func (s *SSEScanner) ContentEvents() int64 { return s.content }

// Usage returns the last usage the stream reported.
func (s *SSEScanner) Usage() (Usage, bool) { return s.usage, s.sawUsage }

// Process consumes one chunk and returns the bytes to forward in its place. Without DropUsageChunk the chunk
// is returned unchanged. With it, a partial trailing line and a held usage line are kept back and forwarded
// (or dropped) once the bytes that decide arrive; end flushes whatever is held.
func (s *SSEScanner) Process(chunk []byte, end bool) []byte {
	var out *[]byte
	var buf []byte
	if s.DropUsageChunk || s.RenameModel != nil {
		buf = make([]byte, 0, len(chunk)+len(s.pending)+len(s.held))
		out = &buf
	}
	data := chunk
	if len(s.pending) > 0 {
		s.pending = append(s.pending, chunk...)
		data = s.pending
	}
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		s.line(data[:i+1], out)
		data = data[i+1:]
	}
	switch {
	case end:
		if len(data) > 0 {
			s.line(data, out) // a last line the server did not end
		}
		if len(s.held) > 0 && out != nil {
			s.held = s.held[:0] // a usage-only event at the very end of the stream: dropped
		}
		s.pending = s.pending[:0]
	case len(data) > maxPendingLine:
		s.passLong(data, out)
	default:
		// Keep the partial line; data is a suffix of pending or of chunk (copy handles the overlap).
		if len(s.pending) > 0 {
			s.pending = s.pending[:copy(s.pending, data)]
		} else {
			s.pending = append(s.pending, data...)
		}
	}
	if out == nil {
		return chunk
	}
	return *out
}

// passLong forwards a line too long to hold, unparsed, and remembers to skip the rest of it.
func (s *SSEScanner) passLong(data []byte, out *[]byte) {
	s.release(out)
	if out != nil {
		*out = append(*out, data...)
	}
	s.pending, s.tooLong, s.midEvent = s.pending[:0], true, true
}

// release forwards the held line: what followed it shows it was not an event of its own.
func (s *SSEScanner) release(out *[]byte) {
	if len(s.held) > 0 {
		if out != nil {
			*out = append(*out, s.held...)
		}
		s.held = s.held[:0]
	}
}

// line handles one complete line (with its terminator, if any).
func (s *SSEScanner) line(l []byte, out *[]byte) {
	if s.tooLong { // the end of a line already passed through unparsed
		s.tooLong = false
		if out != nil {
			*out = append(*out, l...)
		}
		return
	}
	text := bytes.TrimRight(l, "\r\n")
	if len(text) == 0 { // blank line: the event ends
		if len(s.held) > 0 && out != nil {
			s.held = s.held[:0] // the held usage line was an event of its own: drop it and this blank line
			s.midEvent = false
			return
		}
		s.midEvent = false
		if out != nil {
			*out = append(*out, l...)
		}
		return
	}
	s.release(out)
	usageOnly := s.dataLine(text)
	if usageOnly && !s.midEvent && s.DropUsageChunk {
		s.held = s.appendLine(s.held, l)
		s.midEvent = true
		return
	}
	s.midEvent = true
	if out != nil {
		*out = s.appendLine(*out, l)
	}
}

// appendLine appends a complete line as it is forwarded: with its model renamed when asked.
func (s *SSEScanner) appendLine(dst, l []byte) []byte {
	if s.RenameModel != nil {
		return AppendRenamedModel(dst, l, s.RenameModel)
	}
	return append(dst, l...)
}

var dataPrefix, doneMarker = []byte("data:"), []byte("[DONE]")

// dataLine reads one line's data payload, if it is a JSON data line, and reports whether it is the
// usage-only chunk (usage and an empty choices array).
func (s *SSEScanner) dataLine(text []byte) (usageOnly bool) {
	payload, ok := bytes.CutPrefix(text, dataPrefix)
	if !ok {
		return false
	}
	payload = bytes.TrimLeft(payload, " ")
	if len(payload) == 0 || payload[0] != '{' {
		s.complete = s.complete || bytes.Equal(payload, doneMarker)
		return false // [DONE] and keep-alives
	}
	p := parsers.Get()
	defer parsers.Put(p)
	doc, err := p.ParseBytes(payload)
	if err != nil {
		return false
	}
	if typ := doc.GetStringBytes("type"); len(typ) > 0 {
		s.responsesEvent(doc, typ)
		return false
	}
	choices := doc.Get("choices")
	isArray := choices != nil && choices.Type() == fastjson.TypeArray
	if isArray && len(choices.GetArray()) > 0 {
		s.content++
		if s.Text != nil {
			writeChoicesText(s.Text, choices, "delta")
		}
		if s.finish == "" {
			s.finish = choicesFinish(choices)
		}
	}
	obj := doc.Get("usage")
	if obj == nil || obj.Type() != fastjson.TypeObject {
		return false
	}
	u, ok := parseUsageObject(obj)
	if !ok {
		return false
	}
	s.usage, s.sawUsage = u, true
	return isArray && len(choices.GetArray()) == 0
}

// responsesEvent reads one event of a Responses API stream: output_text deltas carry the generated text, and
// the terminal event (completed, incomplete or failed) the response with its usage.
func (s *SSEScanner) responsesEvent(doc *fastjson.Value, typ []byte) {
	switch string(typ) {
	case "response.output_text.delta":
		s.content++
		if s.Text != nil {
			_, _ = s.Text.Write(doc.GetStringBytes("delta"))
		}
	case "response.completed", "response.incomplete", "response.failed":
		s.complete = true
		if resp := doc.Get("response"); resp != nil && s.finish == "" {
			s.finish = responsesFinish(resp)
		}
		if obj := doc.Get("response", "usage"); obj != nil && obj.Type() == fastjson.TypeObject {
			if u, ok := parseUsageObject(obj); ok {
				s.usage, s.sawUsage = u, true
			}
		}
	}
}

// writeChoicesText writes each choice's generated text: <holder>.content for chat, text for completions.
func writeChoicesText(w io.Writer, choices *fastjson.Value, holder string) {
	for _, c := range choices.GetArray() {
		if b := c.GetStringBytes(holder, "content"); len(b) > 0 {
			_, _ = w.Write(b)
		} else if b := c.GetStringBytes("text"); len(b) > 0 {
			_, _ = w.Write(b)
		}
	}
}

// OutputText writes the generated text of a non-streaming response body (every choice's message.content or
// text, or a Responses API body's output_text parts, in order) to w; it writes nothing for any other body.
func OutputText(body []byte, w io.Writer) {
	p := parsers.Get()
	defer parsers.Put(p)
	doc, err := p.ParseBytes(body)
	if err != nil {
		return
	}
	if choices := doc.Get("choices"); choices != nil && choices.Type() == fastjson.TypeArray {
		writeChoicesText(w, choices, "message")
		return
	}
	// The Responses API: output items whose content parts of type output_text carry the text.
	for _, item := range doc.GetArray("output") {
		for _, part := range item.GetArray("content") {
			if string(part.GetStringBytes("type")) == "output_text" {
				_, _ = w.Write(part.GetStringBytes("text"))
			}
		}
	}
}

// AppendRenamedModel appends js with the value of its first "model" key replaced by quoted (a JSON string,
// quotes included), or js unchanged when it has no such key with a string value. A key is a quote not escaped inside a string, so a
// "model" that only appears in generated text (escaped there) is never touched. Responses put "model" at the
// top level, before the choices.
func AppendRenamedModel(dst, js, quoted []byte) []byte {
	at, end := modelValueSpan(js)
	if at < 0 {
		return append(dst, js...)
	}
	dst = append(dst, js[:at]...)
	dst = append(dst, quoted...)
	return append(dst, js[end:]...)
}

// modelValueSpan finds the string value of the first "model" key: [at, end) covers it quotes included.
func modelValueSpan(js []byte) (at, end int) {
	const key = `"model"`
	for i := 0; i < len(js); i++ {
		if js[i] != '"' {
			continue
		}
		close, err := skipString(js, i+1)
		if err != nil {
			return -1, -1
		}
		if close-i+1 == len(key) && string(js[i:close+1]) == key {
			j := close + 1
			for j < len(js) && (js[j] == ' ' || js[j] == '\t') {
				j++
			}
			if j < len(js) && js[j] == ':' {
				j++
				for j < len(js) && (js[j] == ' ' || js[j] == '\t') {
					j++
				}
				if j < len(js) && js[j] == '"' {
					vend, err := skipString(js, j+1)
					if err != nil {
						return -1, -1
					}
					return j, vend + 1
				}
				return -1, -1
			}
		}
		i = close
	}
	return -1, -1
}
