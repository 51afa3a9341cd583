package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Endpoint is one of the inference APIs the gateway routes.
type Endpoint int

// The routed inference endpoints; EndpointNone is everything else.
const (
	EndpointNone Endpoint = iota
	EndpointChat
	EndpointCompletions
	EndpointEmbeddings
	EndpointModels
	// EndpointModel is GET /v1/models/{id}: one model object.
	EndpointModel
	// EndpointResponses is POST /v1/responses, OpenAI's Responses API (served by vLLM too).
	EndpointResponses
)

// Paths of the OpenAI-compatible API.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathEmbeddings  = "/v1/embeddings"
	PathModels      = "/v1/models"
	PathResponses   = "/v1/responses"
)

// EndpointForPath maps a request :path (query string allowed) to its endpoint.
func EndpointForPath(path string) Endpoint {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	// Exact paths only: "/v1/chat/completions/" is not the chat API on an OpenAI-compatible server (the
	// engines answer 404 or redirect), so it is not routed either.
	switch path {
	case PathChat:
		return EndpointChat
	case PathCompletions:
		return EndpointCompletions
	case PathEmbeddings:
		return EndpointEmbeddings
	case PathModels:
		return EndpointModels
	case PathResponses:
		return EndpointResponses
	}
	if id := ModelID(path); id != "" {
		return EndpointModel
	}
	return EndpointNone
}

// ModelID is the {id} of a /v1/models/{id} path (unescaped; it may hold '/', as in "meta-llama/Llama-3.3"), or
// "" for any other path.
func ModelID(path string) string {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	rest, ok := strings.CutPrefix(path, PathModels+"/")
	if !ok || rest == "" || strings.HasSuffix(rest, "/") {
		return ""
	}
	id, err := url.PathUnescape(rest)
	if err != nil || strings.ContainsAny(id, "\x00\r\n") {
		return ""
	}
	return id
}

func (e Endpoint) String() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "completions"
	case EndpointEmbeddings:
		return "embeddings"
	case EndpointModels, EndpointModel:
		return "models"
	case EndpointResponses:
		return "responses"
	}
	return "other"
}

// promptField is the body field that carries the prompt for each endpoint.
func (e Endpoint) promptField() string {
	switch e {
	case EndpointChat:
		return "messages"
	case EndpointCompletions:
		return "prompt"
	case EndpointEmbeddings, EndpointResponses:
		return "input"
	}
	return ""
}

// maxTokensField is the body field that bounds the output: max_tokens, or the Responses API's
// max_output_tokens.
func (e Endpoint) maxTokensField() string {
	if e == EndpointResponses {
		return "max_output_tokens"
	}
	return "max_tokens"
}

// Request is what routing and accounting need from an inference request body. The body is validated and
// indexed in one walk that allocates nothing per JSON value (scan.go), and its fields are read where they lie:
// a hostile body's millions of elements in a field the gateway ignores cost a scan, never a heap. Prompt and
// Instructions point into the body and stay valid as long as it does.
type Request struct {
	Endpoint     Endpoint
	Model        string
	Stream       bool
	IncludeUsage bool  // stream_options.include_usage
	MaxTokens    int64 // max_completion_tokens, else max_tokens; 0 when absent
	// Choices is how many sequences the engine generates for the request, each up to MaxTokens: the larger
	// of n and best_of (completions), at least 1. Admission reserves that many outputs.
	Choices int64
	User    string
	// Prompt is the messages / prompt / input value exactly as the client sent it; read it with Elements,
	// Member and Compact.
	Prompt []byte
	// Instructions is the Responses API's system prompt (a JSON string, quotes included), when the body has
	// one; it comes before the input.
	Instructions []byte
	// BodyBytes is the size of the body as received; the prompt is nearly all of it.
	BodyBytes int

	body []byte
	// where the fields the rewrite edits lie; end 0 when absent
	model, streamOptions, maxTokens span
	includeUsage                    span // stream_options.include_usage, inside streamOptions
	objectEnd                       int  // just past the top-level '}'
}

// ParseRequest validates the body as JSON and reads the routing fields. A malformed body or a missing or
// mistyped field gives a 400 *Error naming it.
func ParseRequest(ep Endpoint, body []byte) (Request, error) {
	return ParseRequestYielding(ep, body, runtime.Gosched)
}

// ParseRequestYielding is ParseRequest calling yield between slices of a large body's scan, so that the caller
// decides how such work gives way to others (the gateway's also lets the network in: netturn.Yield).
func ParseRequestYielding(ep Endpoint, body []byte, yield func()) (Request, error) {
	req := Request{Endpoint: ep, BodyBytes: len(body), body: body}
	idx := bodyIndex{promptField: ep.promptField()}
	if err := screen(body, &idx, yield); err != nil {
		return Request{Endpoint: ep, BodyBytes: len(body)}, err
	}
	req.objectEnd = idx.end
	limits, fieldErr := req.readFields(&idx)
	if fieldErr == nil {
		fieldErr = req.missingField()
	}
	if fieldErr != nil {
		return Request{Endpoint: ep, BodyBytes: len(body)}, fieldErr
	}
	req.MaxTokens = limits.bound()
	req.Choices = max(1, limits.n, limits.bestOf)
	return req, nil
}

// screen refuses an empty body, a body that is not JSON, nests too deep or is not an object, and indexes the
// top-level fields of the rest.
func screen(body []byte, idx *bodyIndex, yield func()) error {
	if len(body) == 0 {
		return BadRequest("", "The request body is empty; send a JSON object.")
	}
	err := scanBody(body, MaxJSONDepth, idx, yield)
	switch se, _ := err.(*scanError); {
	case se != nil && se.grammar:
		return malformed(body, err)
	case err != nil:
		return BadRequest("", "We could not parse the JSON body of your request: %s. (HINT: the API expects a JSON object.)", err)
	case !idx.object:
		return BadRequest("", "The request body must be a JSON object.")
	}
	return nil
}

// tokenLimits are the output bounds a body sets, held apart until every field is read because which one wins
// does not depend on their order in the body.
type tokenLimits struct{ maxTokens, maxCompletion, n, bestOf int64 }

// bound is the output bound the request asks for: max_completion_tokens (or max_output_tokens) over
// max_tokens; 0 when neither is set.
func (l tokenLimits) bound() int64 {
	switch {
	case l.maxCompletion > 0:
		return l.maxCompletion
	case l.maxTokens > 0:
		return l.maxTokens
	}
	return 0
}

// readFields reads the routed fields of the top-level object into req, and returns the first field error in
// body order. A repeated routed key is an error: parsers disagree on which of two equal keys wins (the
// engine's Python json takes the last), so a body whose routed fields are ambiguous is refused rather than
// routed on one reading and served on another.
func (req *Request) readFields(idx *bodyIndex) (tokenLimits, *Error) {
	var limits tokenLimits
	for _, f := range idx.fields[:idx.n] {
		name := fieldNames[f.field]
		if f.field == fieldPrompt {
			name = idx.promptField
		}
		if f.repeated {
			return limits, BadRequest(name, "The request body repeats the key '%s'; send each field once.", name)
		}
		if e := req.readField(f.field, f.value, &limits, idx); e != nil {
			return limits, e
		}
	}
	return limits, nil
}

// readField reads one top-level field, if routing or accounting uses it for this endpoint, and checks its
// type; other fields pass through unread.
func (req *Request) readField(field int, at span, limits *tokenLimits, idx *bodyIndex) *Error {
	v := req.body[at.start:at.end]
	var e *Error
	switch field {
	case fieldKVTransferParams, fieldBootstrapHost, fieldBootstrapPort, fieldBootstrapRoom:
		name := fieldNames[field]
		return BadRequest(name, "'%s' is set by the gateway when it splits prefill from decode; a request may not set it.", name)
	case fieldModel:
		model, ok := stringValue(v)
		if !ok {
			return BadRequest("model", "'model' must be a string.")
		}
		req.Model, req.model = model, at
	case fieldStream:
		req.Stream, e = parseBool("stream", v)
	case fieldStreamOptions:
		e = req.parseStreamOptions(at)
	case fieldMaxTokens:
		limits.maxTokens, e = parseCount("max_tokens", v)
		if req.Endpoint != EndpointResponses {
			req.maxTokens = at
		}
	case fieldMaxCompletionTokens:
		limits.maxCompletion, e = parseCount("max_completion_tokens", v)
	case fieldMaxOutputTokens:
		if req.Endpoint == EndpointResponses {
			limits.maxCompletion, e = parseCount("max_output_tokens", v)
			req.maxTokens = at
		}
	case fieldN: // several completions of one prompt: chat and completions
		if req.Endpoint == EndpointChat || req.Endpoint == EndpointCompletions {
			limits.n, e = parseCount("n", v)
		}
	case fieldBestOf: // completions generate best_of sequences and return n of them
		if req.Endpoint == EndpointCompletions {
			limits.bestOf, e = parseCount("best_of", v)
		}
	case fieldInstructions:
		if req.Endpoint == EndpointResponses {
			e = checkInstructions(req, v)
		}
	case fieldUser:
		req.User, _ = stringValue(v)
	case fieldPrompt:
		req.Prompt = v
		e = checkPrompt(req.Endpoint, v, idx)
	}
	return e
}

// missingField names the first required field a body without field errors lacks: the model routes the
// request and the prompt is what it is for.
func (req *Request) missingField() *Error {
	switch {
	case req.Model == "":
		return BadRequest("model", "You must provide a model parameter.")
	case req.Prompt == nil:
		promptField := req.Endpoint.promptField()
		return BadRequest(promptField, "Missing required parameter: '%s'.", promptField)
	}
	return nil
}

// parseBool reads true, or false or null for the default (false).
func parseBool(field string, v []byte) (bool, *Error) {
	switch string(v) {
	case "true":
		return true, nil
	case "false", "null":
		return false, nil
	}
	return false, BadRequest(field, "'%s' must be a boolean.", field)
}

// checkInstructions reads the Responses API's instructions: a string, or null.
func checkInstructions(req *Request, v []byte) *Error {
	switch {
	case string(v) == "null":
		return nil
	case v[0] == '"':
		req.Instructions = v
		return nil
	}
	return BadRequest("instructions", "'instructions' must be a string.")
}

// describeJSONError says briefly what is wrong with a body that does not parse and where: the standard
// library's reading, with its byte offset, rather than the fast parser's chain of contexts. It runs only on
// bodies already refused, which the pre-scan has bounded.
// malformed is the error for a body that is not JSON.
func malformed(body []byte, err error) *Error {
	return BadRequest("", "We could not parse the JSON body of your request: %s. (HINT: the API expects a JSON object.)", describeJSONError(body, err))
}

func describeJSONError(body []byte, fallback error) string {
	var raw json.RawMessage // checks the grammar over the whole input without building values
	err := json.Unmarshal(body, &raw)
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn) && syn.Error() == "unexpected end of JSON input":
		return fmt.Sprintf("the body ends too early, at offset %d", len(body))
	case errors.As(err, &syn):
		return fmt.Sprintf("%s at offset %d", syn.Error(), max(0, syn.Offset-1)) // the offending byte, from 0
	}
	return trimErr(fallback)
}

// trimErr keeps a parser error short: fastjson quotes the tail of the input, which may be a whole prompt.
func trimErr(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "; unparsed tail"); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return msg
}

// Release drops the request's hold on its body.
func (r *Request) Release() {
	r.body, r.Prompt, r.Instructions = nil, nil, nil
}

// parseStreamOptions reads stream_options: null, or an object whose include_usage is a boolean or null. A
// repeated include_usage is refused, as a repeated top-level field is.
func (req *Request) parseStreamOptions(at span) *Error {
	v := req.body[at.start:at.end]
	req.streamOptions = at
	switch {
	case string(v) == "null":
		return nil
	case v[0] != '{':
		return BadRequest("stream_options", "'stream_options' must be an object.")
	}
	c := Members(v)
	for {
		key, value, ok := c.NextMember()
		if !ok {
			return nil
		}
		if !keyIs(key, "include_usage") {
			continue
		}
		if req.includeUsage.end != 0 {
			return BadRequest("stream_options.include_usage", "The request body repeats the key 'stream_options.include_usage'; send each field once.")
		}
		start := at.start + c.i - len(value) // the cursor stands just past the value
		req.includeUsage = span{start, start + len(value)}
		var e *Error
		if req.IncludeUsage, e = parseBool("stream_options.include_usage", value); e != nil {
			return e
		}
	}
}

// parseCount reads a positive integer, or null for none.
func parseCount(field string, v []byte) (int64, *Error) {
	if string(v) == "null" {
		return 0, nil
	}
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return 0, BadRequest(field, "'%s' must be an integer.", field)
	}
	n, ok := positiveInt(v)
	if !ok {
		return 0, BadRequest(field, "'%s' must be a positive integer, got %s.", field, v)
	}
	return n, nil
}

// positiveInt reads a JSON number that is a whole number from 1 to MaxInt64 written without a fraction or
// an exponent.
func positiveInt(v []byte) (int64, bool) {
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (1<<63-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, n >= 1
}

// checkPrompt checks the prompt's type; idx has counted an array prompt's elements.
func checkPrompt(ep Endpoint, v []byte, idx *bodyIndex) *Error {
	field := ep.promptField()
	switch ep {
	case EndpointChat:
		switch {
		case v[0] != '[':
			return BadRequest(field, "'messages' must be an array of message objects.")
		case idx.promptNonObjects:
			return BadRequest(field, "each entry of 'messages' must be an object.")
		case idx.promptItems == 0:
			return BadRequest(field, "'messages' must contain at least one message.")
		}
	default:
		if v[0] != '"' && v[0] != '[' {
			return BadRequest(field, "'%s' must be a string or an array.", field)
		}
	}
	return nil
}

// EstimatePromptTokens approximates prompt tokens from the body size (about four bytes a token), for
// admission before the engine reports the real count.
func (r *Request) EstimatePromptTokens() int {
	return r.BodyBytes/4 + 1
}

// Edits are the changes the gateway makes to a body on its way upstream.
type Edits struct {
	// Model renames the model when not empty.
	Model string
	// IncludeUsage forces stream_options.include_usage to true.
	IncludeUsage bool
	// MaxTokens, when above zero, sets max_tokens (max_output_tokens for the Responses API): the output bound
	// admission reserved for a request that set none, so the engine cannot produce more than was charged.
	MaxTokens int64
}

// Rewrite returns the body with the edits applied, every byte it does not edit as the client sent it. It
// appends to dst, which may be nil.
func (r *Request) Rewrite(dst []byte, e Edits) []byte { return r.RewriteYielding(dst, e, nil) }

// RewriteYielding is Rewrite calling yield between slices of a large body's copy, as ParseRequestYielding
// does between slices of its scan; a nil yield never does.
func (r *Request) RewriteYielding(dst []byte, e Edits, yield func()) []byte {
	var edits [3]splice
	n := 0
	add := func(s splice) { edits[n] = s; n++ }
	if e.Model != "" {
		add(splice{at: r.model, model: e.Model})
	}
	if e.IncludeUsage {
		switch {
		case r.includeUsage.end != 0:
			add(splice{at: r.includeUsage, text: "true"})
		case r.streamOptions.end != 0 && r.body[r.streamOptions.start] != '{': // null
			add(splice{at: r.streamOptions, text: `{"include_usage":true}`})
		case r.streamOptions.end != 0:
			open := r.streamOptions.start + 1
			add(splice{at: span{open, open}, text: `"include_usage":true`,
				comma: !emptyObject(r.body[r.streamOptions.start:r.streamOptions.end])})
		default:
			add(splice{at: span{r.objectEnd - 1, r.objectEnd - 1}, key: "stream_options", text: `{"include_usage":true}`})
		}
		r.IncludeUsage = true
	}
	if e.MaxTokens > 0 {
		s := splice{at: r.maxTokens, number: e.MaxTokens}
		if r.maxTokens.end == 0 {
			s.at, s.key = span{r.objectEnd - 1, r.objectEnd - 1}, r.Endpoint.maxTokensField()
		}
		add(s)
	}
	sortSplices(edits[:n])
	from := 0
	for _, s := range edits[:n] {
		dst = appendYielding(dst, r.body[from:s.at.start], yield)
		dst = s.appendTo(dst)
		from = s.at.end
	}
	return appendYielding(dst, r.body[from:], yield)
}

// copyEvery is how much of a large body RewriteYielding copies between two yields: some tens of microseconds.
const copyEvery = 256 << 10

// appendYielding appends src to dst, calling yield after each copyEvery bytes when yield is not nil.
func appendYielding(dst, src []byte, yield func()) []byte {
	if yield == nil {
		return append(dst, src...)
	}
	dst = slices.Grow(dst, len(src))
	for len(src) > copyEvery {
		dst = append(dst, src[:copyEvery]...)
		src = src[copyEvery:]
		yield()
	}
	return append(dst, src...)
}

// splice replaces the bytes at [at.start, at.end) — or inserts at at.start when the span is empty — with a
// model name, a number or text; a key makes it a new member of the top-level object (after a comma, which
// the object needs since it has a model), comma a new first member of a non-empty object.
type splice struct {
	at     span
	key    string
	model  string
	number int64
	text   string
	comma  bool
}

func (s splice) appendTo(dst []byte) []byte {
	if s.key != "" {
		dst = append(dst, ',')
		dst = appendJSONString(dst, s.key)
		dst = append(dst, ':')
	}
	switch {
	case s.model != "":
		dst = appendJSONString(dst, s.model)
	case s.number > 0:
		dst = strconv.AppendInt(dst, s.number, 10)
	default:
		dst = append(dst, s.text...)
	}
	if s.comma {
		dst = append(dst, ',')
	}
	return dst
}

// sortSplices orders at most three splices by position; insertions at the same place keep their order.
func sortSplices(s []splice) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].at.start < s[j-1].at.start; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// emptyObject reports whether obj has no members.
func emptyObject(obj []byte) bool {
	c := Members(obj)
	_, _, ok := c.NextMember()
	return !ok
}

// appendJSONString appends s as a JSON string: quotes, backslashes and control characters escaped, the rest
// (UTF-8 included) as it is.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
