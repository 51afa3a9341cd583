package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/buger/jsonparser"
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
)

// Paths of the OpenAI-compatible API.
const (
	PathChat        = "/v1/chat/completions"
	PathCompletions = "/v1/completions"
	PathEmbeddings  = "/v1/embeddings"
	PathModels      = "/v1/models"
)

// EndpointForPath maps a request :path (query string allowed) to its endpoint.
func EndpointForPath(path string) Endpoint {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case PathChat:
		return EndpointChat
	case PathCompletions:
		return EndpointCompletions
	case PathEmbeddings:
		return EndpointEmbeddings
	case PathModels:
		return EndpointModels
	}
	return EndpointNone
}

func (e Endpoint) String() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "completions"
	case EndpointEmbeddings:
		return "embeddings"
	case EndpointModels:
		return "models"
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
	case EndpointEmbeddings:
		return "input"
	}
	return ""
}

// Request is what routing and accounting need from an inference request body. Prompt aliases the body it was
// parsed from: nothing of the prompt is decoded or copied here.
type Request struct {
	Endpoint     Endpoint
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	MaxTokens    int  // max_completion_tokens, else max_tokens; 0 when absent
	User         string
	Prompt       []byte // raw JSON of messages / prompt / input
}

// ParseRequest validates the body as JSON and reads the routing fields. A malformed body or a missing or
// mistyped field gives a 400 *Error naming it.
func ParseRequest(ep Endpoint, body []byte) (Request, error) {
	req := Request{Endpoint: ep}
	if len(body) == 0 {
		return req, BadRequest("", "The request body is empty; send a JSON object.")
	}
	if !json.Valid(body) {
		return req, BadRequest("", "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)")
	}
	if _, vt, _, _ := jsonparser.Get(body); vt != jsonparser.Object {
		return req, BadRequest("", "The request body must be a JSON object.")
	}
	promptField := ep.promptField()
	var maxTokens, maxCompletion int64
	var fieldErr *Error
	err := jsonparser.ObjectEach(body, func(key, value []byte, vt jsonparser.ValueType, _ int) error {
		var e *Error
		switch string(key) {
		case "model":
			if vt != jsonparser.String {
				e = BadRequest("model", "'model' must be a string.")
				break
			}
			s, err := jsonparser.ParseString(value)
			if err != nil {
				e = BadRequest("model", "'model' is not a valid string.")
			}
			req.Model = s
		case "stream":
			switch vt {
			case jsonparser.Boolean:
				req.Stream = value[0] == 't'
			case jsonparser.Null:
			default:
				e = BadRequest("stream", "'stream' must be a boolean.")
			}
		case "stream_options":
			e = parseStreamOptions(&req, value, vt)
		case "max_tokens":
			maxTokens, e = parseCount("max_tokens", value, vt)
		case "max_completion_tokens":
			maxCompletion, e = parseCount("max_completion_tokens", value, vt)
		case "user":
			if vt == jsonparser.String {
				req.User, _ = jsonparser.ParseString(value)
			}
		case promptField:
			req.Prompt = value
			e = checkPrompt(ep, value, vt)
		}
		if e != nil && fieldErr == nil {
			fieldErr = e
		}
		return nil
	})
	if err != nil {
		return req, BadRequest("", "We could not parse the JSON body of your request: %v.", err)
	}
	if fieldErr != nil {
		return req, fieldErr
	}
	if req.Model == "" {
		return req, BadRequest("model", "You must provide a model parameter.")
	}
	if req.Prompt == nil {
		return req, BadRequest(promptField, "Missing required parameter: '%s'.", promptField)
	}
	switch {
	case maxCompletion > 0:
		req.MaxTokens = int(maxCompletion)
	case maxTokens > 0:
		req.MaxTokens = int(maxTokens)
	}
	return req, nil
}

func parseStreamOptions(req *Request, value []byte, vt jsonparser.ValueType) *Error {
	switch vt {
	case jsonparser.Null:
		return nil
	case jsonparser.Object:
	default:
		return BadRequest("stream_options", "'stream_options' must be an object.")
	}
	v, t, _, err := jsonparser.Get(value, "include_usage")
	switch {
	case errors.Is(err, jsonparser.KeyPathNotFoundError) || t == jsonparser.Null:
		return nil
	case err != nil || t != jsonparser.Boolean:
		return BadRequest("stream_options.include_usage", "'stream_options.include_usage' must be a boolean.")
	}
	req.IncludeUsage = v[0] == 't'
	return nil
}

func parseCount(field string, value []byte, vt jsonparser.ValueType) (int64, *Error) {
	if vt == jsonparser.Null {
		return 0, nil
	}
	if vt != jsonparser.Number {
		return 0, BadRequest(field, "'%s' must be an integer.", field)
	}
	n, err := jsonparser.ParseInt(value)
	if err != nil || n < 1 {
		return 0, BadRequest(field, "'%s' must be a positive integer, got %s.", field, value)
	}
	return n, nil
}

func checkPrompt(ep Endpoint, value []byte, vt jsonparser.ValueType) *Error {
	field := ep.promptField()
	switch ep {
	case EndpointChat:
		if vt != jsonparser.Array {
			return BadRequest(field, "'messages' must be an array of message objects.")
		}
		n := 0
		var bad bool
		_, _ = jsonparser.ArrayEach(value, func(_ []byte, t jsonparser.ValueType, _ int, _ error) {
			n++
			if t != jsonparser.Object {
				bad = true
			}
		})
		if n == 0 {
			return BadRequest(field, "'messages' must contain at least one message.")
		}
		if bad {
			return BadRequest(field, "each entry of 'messages' must be an object.")
		}
	default:
		if vt != jsonparser.String && vt != jsonparser.Array {
			return BadRequest(field, "'%s' must be a string or an array.", field)
		}
	}
	return nil
}

// EstimatePromptTokens approximates prompt tokens from the raw prompt JSON (about four bytes a token), for
// admission before the engine reports the real count.
func (r *Request) EstimatePromptTokens() int {
	return len(r.Prompt)/4 + 1
}

// Rewrite returns the body with the model renamed (when newModel is not empty) and, when injectUsage is set,
// stream_options.include_usage forced to true. Everything else is kept byte for byte.
func Rewrite(body []byte, newModel string, injectUsage bool) ([]byte, error) {
	var err error
	if newModel != "" {
		quoted, _ := json.Marshal(newModel) // a string: cannot fail
		body, err = jsonparser.Set(body, quoted, "model")
		if err != nil {
			return nil, fmt.Errorf("rewrite model: %w", err)
		}
	}
	if injectUsage {
		if _, vt, _, _ := jsonparser.Get(body, "stream_options"); vt == jsonparser.Object {
			body, err = jsonparser.Set(body, []byte("true"), "stream_options", "include_usage")
		} else {
			body, err = jsonparser.Set(body, []byte(`{"include_usage":true}`), "stream_options")
		}
		if err != nil {
			return nil, fmt.Errorf("inject stream_options.include_usage: %w", err)
		}
	}
	return body, nil
}
