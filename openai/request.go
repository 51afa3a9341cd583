package openai

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fastjson"
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

// Request is what routing and accounting need from an inference request body. The body is parsed once
// (fastjson: no Go value per JSON value, strings left escaped until read); Prompt and the parsed document stay
// valid until Release.
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
	// Prompt is the parsed messages / prompt / input value.
	Prompt *fastjson.Value
	// Instructions is the Responses API's system prompt, when the body has one; it comes before the input.
	Instructions *fastjson.Value
	// BodyBytes is the size of the body as received; the prompt is nearly all of it.
	BodyBytes int
	// PromptStart and PromptEnd locate the prompt field's value in the body as received (-1 when the scan did
	// not find it, as for a key written with escapes): what the audit log digests, without parsing again.
	PromptStart, PromptEnd int

	doc    *fastjson.Value
	parser *fastjson.Parser
	body   []byte
}

var parsers fastjson.ParserPool

// ParseRequest validates the body as JSON and reads the routing fields. A malformed body or a missing or
// mistyped field gives a 400 *Error naming it. Call Release when done with the request.
func ParseRequest(ep Endpoint, body []byte) (Request, error) {
	req := Request{Endpoint: ep, BodyBytes: len(body)}
	if err := req.screen(body); err != nil {
		return req, err
	}
	obj, err := req.parse(body)
	if err != nil {
		return req, err
	}
	limits, fieldErr := req.readFields(obj)
	if fieldErr == nil {
		fieldErr = req.missingField()
	}
	if fieldErr != nil {
		req.Release()
		return req, fieldErr
	}
	req.MaxTokens = limits.bound()
	req.Choices = max(1, limits.n, limits.bestOf)
	return req, nil
}

// screen refuses an empty body and checks the rest in one linear scan before any parser sees it: the recursive
// parser must never see a deep body, and leaves escapes, numbers and control characters in strings unchecked
// (scan.go). The scan also locates the prompt's value, for the audit log.
func (req *Request) screen(body []byte) error {
	if len(body) == 0 {
		return BadRequest("", "The request body is empty; send a JSON object.")
	}
	start, end, err := scanBody(body, MaxJSONDepth, req.Endpoint.promptField())
	switch se, _ := err.(*scanError); {
	case se != nil && se.grammar:
		return malformed(body, err)
	case err != nil:
		return BadRequest("", "We could not parse the JSON body of your request: %s. (HINT: the API expects a JSON object.)", err)
	}
	req.PromptStart, req.PromptEnd = start, end
	return nil
}

// parse parses a screened body with a pooled parser, which req then holds until Release (the fields it reads
// point into the parser's document), and returns the top-level object.
func (req *Request) parse(body []byte) (*fastjson.Object, error) {
	p := parsers.Get()
	doc, err := p.ParseBytes(body)
	if err != nil { // the structure: where commas, colons and keys go
		parsers.Put(p)
		return nil, malformed(body, err)
	}
	req.doc, req.parser, req.body = doc, p, body
	obj, err := doc.Object()
	if err != nil {
		req.Release()
		return nil, BadRequest("", "The request body must be a JSON object.")
	}
	return obj, nil
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

// readFields reads the routed fields of the top-level object into req in one pass, and returns the first
// field error in body order. A repeated routed key is an error: parsers disagree on which of two equal keys
// wins (the engine's Python json takes the last), so a body whose routed fields are ambiguous is refused
// rather than routed on one reading and served on another.
func (req *Request) readFields(obj *fastjson.Object) (tokenLimits, *Error) {
	promptField := req.Endpoint.promptField()
	var limits tokenLimits
	var fieldErr *Error
	var seen routedKeys
	obj.Visit(func(key []byte, v *fastjson.Value) {
		if seen.repeated(string(key), promptField) {
			fieldErr = cmp.Or(fieldErr, BadRequest(string(key), "The request body repeats the key '%s'; send each field once.", key))
			return
		}
		if e := req.readField(key, v, promptField, &limits); e != nil && fieldErr == nil {
			fieldErr = e
		}
	})
	return limits, fieldErr
}

// readField reads one top-level field, if routing or accounting uses it for this endpoint, and checks its
// type; other fields pass through unread.
func (req *Request) readField(key []byte, v *fastjson.Value, promptField string, limits *tokenLimits) *Error {
	var e *Error
	switch string(key) {
	case "model":
		b, err := v.StringBytes()
		if err != nil {
			return BadRequest("model", "'model' must be a string.")
		}
		req.Model = string(b)
	case "stream":
		e = parseStream(req, v)
	case "stream_options":
		e = parseStreamOptions(req, v)
	case "max_tokens":
		limits.maxTokens, e = parseCount("max_tokens", v)
	case "max_completion_tokens":
		limits.maxCompletion, e = parseCount("max_completion_tokens", v)
	case "max_output_tokens":
		if req.Endpoint == EndpointResponses {
			limits.maxCompletion, e = parseCount("max_output_tokens", v)
		}
	case "n": // several completions of one prompt: chat and completions
		if req.Endpoint == EndpointChat || req.Endpoint == EndpointCompletions {
			limits.n, e = parseCount("n", v)
		}
	case "best_of": // completions generate best_of sequences and return n of them
		if req.Endpoint == EndpointCompletions {
			limits.bestOf, e = parseCount("best_of", v)
		}
	case "instructions":
		if req.Endpoint == EndpointResponses {
			e = checkInstructions(req, v)
		}
	case "user":
		if b, err := v.StringBytes(); err == nil {
			req.User = string(b)
		}
	case promptField:
		req.Prompt = v
		e = checkPrompt(req.Endpoint, v)
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

// parseStream reads stream: true, or false or null for the default (not streamed).
func parseStream(req *Request, v *fastjson.Value) *Error {
	switch v.Type() {
	case fastjson.TypeTrue:
		req.Stream = true
	case fastjson.TypeFalse, fastjson.TypeNull:
	default:
		return BadRequest("stream", "'stream' must be a boolean.")
	}
	return nil
}

// routedKeys remembers which of the fields the gateway reads were already seen in a body.
type routedKeys uint16

// checkInstructions reads the Responses API's instructions: a string, or null.
func checkInstructions(req *Request, v *fastjson.Value) *Error {
	switch v.Type() {
	case fastjson.TypeNull:
		return nil
	case fastjson.TypeString:
		req.Instructions = v
		return nil
	}
	return BadRequest("instructions", "'instructions' must be a string.")
}

// repeated marks key as seen and reports whether it had been: only for the fields routing and quotas read.
func (k *routedKeys) repeated(key, promptField string) bool {
	var bit routedKeys
	switch key {
	case "model":
		bit = 1
	case "stream":
		bit = 2
	case "stream_options":
		bit = 4
	case "max_tokens":
		bit = 8
	case "max_completion_tokens":
		bit = 16
	case "instructions":
		bit = 64
	case "max_output_tokens":
		bit = 128
	case "n":
		bit = 256
	case "best_of":
		bit = 512
	case promptField:
		bit = 32
	default:
		return false
	}
	had := *k&bit != 0
	*k |= bit
	return had
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

// Release returns the parser to its pool; Prompt must not be used afterwards.
func (r *Request) Release() {
	if r.parser != nil {
		parsers.Put(r.parser)
		r.parser, r.doc, r.Prompt, r.Instructions, r.body = nil, nil, nil, nil, nil
	}
}

func parseStreamOptions(req *Request, v *fastjson.Value) *Error {
	switch v.Type() {
	case fastjson.TypeNull:
		return nil
	case fastjson.TypeObject:
	default:
		return BadRequest("stream_options", "'stream_options' must be an object.")
	}
	iu := v.Get("include_usage")
	if iu == nil {
		return nil
	}
	switch iu.Type() {
	case fastjson.TypeTrue:
		req.IncludeUsage = true
	case fastjson.TypeFalse, fastjson.TypeNull:
	default:
		return BadRequest("stream_options.include_usage", "'stream_options.include_usage' must be a boolean.")
	}
	return nil
}

func parseCount(field string, v *fastjson.Value) (int64, *Error) {
	switch v.Type() {
	case fastjson.TypeNull:
		return 0, nil
	case fastjson.TypeNumber:
	default:
		return 0, BadRequest(field, "'%s' must be an integer.", field)
	}
	n, err := v.Int64()
	if err != nil || n < 1 {
		return 0, BadRequest(field, "'%s' must be a positive integer, got %s.", field, v.String())
	}
	return n, nil
}

func checkPrompt(ep Endpoint, v *fastjson.Value) *Error {
	field := ep.promptField()
	switch ep {
	case EndpointChat:
		msgs, err := v.Array()
		if err != nil {
			return BadRequest(field, "'messages' must be an array of message objects.")
		}
		if len(msgs) == 0 {
			return BadRequest(field, "'messages' must contain at least one message.")
		}
		for _, m := range msgs {
			if m.Type() != fastjson.TypeObject {
				return BadRequest(field, "each entry of 'messages' must be an object.")
			}
		}
	default:
		if t := v.Type(); t != fastjson.TypeString && t != fastjson.TypeArray {
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

// Rewrite returns the body re-encoded with the edits applied. Field order and string escapes are kept;
// insignificant whitespace is not. It appends to dst, which may be nil.
func (r *Request) Rewrite(dst []byte, e Edits) []byte {
	var a fastjson.Arena
	if e.Model != "" {
		r.doc.Set("model", a.NewString(e.Model))
	}
	if e.IncludeUsage {
		so := r.doc.Get("stream_options")
		if so == nil || so.Type() != fastjson.TypeObject {
			so = a.NewObject()
			r.doc.Set("stream_options", so)
		}
		so.Set("include_usage", a.NewTrue())
		r.IncludeUsage = true
	}
	if e.MaxTokens > 0 {
		r.doc.Set(r.Endpoint.maxTokensField(), a.NewNumberString(strconv.FormatInt(e.MaxTokens, 10)))
	}
	out := r.doc.MarshalTo(dst)
	if goQuoted(out[len(dst):]) {
		// fastjson re-escapes strings it decoded with Go quoting (\x01, invalid UTF-8 kept as \xNN), which is
		// not JSON. Re-encode with the standard library from the original bytes instead.
		return rewriteStd(r.body, r.Endpoint, e)
	}
	return out
}

// goQuoted reports whether fastjson wrote a string with Go-only escapes (\a \v \xNN \UNNNNNNNN), which it
// does for control characters and invalid UTF-8 in strings it had decoded. It scans backslashes only, at
// memchr speed, instead of validating the whole body again.
func goQuoted(b []byte) bool {
	for {
		i := bytes.IndexByte(b, '\\')
		if i < 0 || i+1 >= len(b) {
			return false
		}
		switch b[i+1] {
		case 'a', 'v', 'x', 'U':
			return true
		}
		b = b[i+2:] // skip the escaped character (a second backslash included)
	}
}

// rewriteStd edits the top-level fields with encoding/json, keeping every other value's bytes as sent.
func rewriteStd(body []byte, ep Endpoint, e Edits) []byte {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return body
	}
	if e.Model != "" {
		top["model"], _ = json.Marshal(e.Model)
	}
	if e.MaxTokens > 0 {
		top[ep.maxTokensField()] = json.RawMessage(strconv.FormatInt(e.MaxTokens, 10))
	}
	if e.IncludeUsage {
		so := map[string]json.RawMessage{}
		_ = json.Unmarshal(top["stream_options"], &so)
		so["include_usage"] = json.RawMessage("true")
		top["stream_options"], _ = json.Marshal(so)
	}
	out, err := json.Marshal(top)
	if err != nil {
		return body
	}
	return out
}
