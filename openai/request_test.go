package openai

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestEndpointForPath(t *testing.T) {
	tests := map[string]Endpoint{
		"/v1/chat/completions":           EndpointChat,
		"/v1/chat/completions?x=1":       EndpointChat,
		"/v1/chat/completions/":          EndpointNone,
		"/v1/completions":                EndpointCompletions,
		"/v1/embeddings":                 EndpointEmbeddings,
		"/v1/models":                     EndpointModels,
		"/v1/chat":                       EndpointNone,
		"/":                              EndpointNone,
		"/v1/chat/completions/../models": EndpointNone,
		"/v1/models/llama-70b":           EndpointModel,
		"/v1/models/meta-llama/Llama-3":  EndpointModel,
		"/v1/models/":                    EndpointNone,
		"/v1/models/x/":                  EndpointNone,
	}
	for path, want := range tests {
		if got := EndpointForPath(path); got != want {
			t.Errorf("EndpointForPath(%q) = %v, want %v", path, got, want)
		}
	}
}

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name      string
		ep        Endpoint
		body      string
		want      Request
		wantParam string // for errors: the param named
		wantErr   string // substring of the message
	}{
		{name: "chat minimal", ep: EndpointChat,
			body: `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`,
			want: Request{Model: "llama"}},
		{name: "chat streaming with usage and limits", ep: EndpointChat,
			body: `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"user":"u1","model":"m"}`,
			want: Request{Model: "m", Stream: true, IncludeUsage: true, MaxTokens: 7, User: "u1"}},
		{name: "max_completion_tokens wins", ep: EndpointChat,
			body: `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":7,"max_completion_tokens":9}`,
			want: Request{Model: "m", MaxTokens: 9}},
		{name: "escaped model name", ep: EndpointChat,
			body: `{"model":"a\/b\u0041","messages":[{}]}`,
			want: Request{Model: "a/bA"}},
		{name: "nulls are absent", ep: EndpointChat,
			body: `{"model":"m","messages":[{}],"stream":null,"stream_options":null,"max_tokens":null}`,
			want: Request{Model: "m"}},
		{name: "completions string prompt", ep: EndpointCompletions,
			body: `{"model":"m","prompt":"once upon"}`, want: Request{Model: "m"}},
		{name: "completions array prompt", ep: EndpointCompletions,
			body: `{"model":"m","prompt":["a","b"]}`, want: Request{Model: "m"}},
		{name: "embeddings", ep: EndpointEmbeddings,
			body: `{"model":"m","input":"text"}`, want: Request{Model: "m"}},
		{name: "chat with n", ep: EndpointChat,
			body: `{"model":"m","messages":[{}],"n":16,"max_tokens":5}`, want: Request{Model: "m", MaxTokens: 5, Choices: 16}},
		{name: "completions generate best_of", ep: EndpointCompletions,
			body: `{"model":"m","prompt":"x","n":2,"best_of":5}`, want: Request{Model: "m", Choices: 5}},
		{name: "best_of is no chat field", ep: EndpointChat,
			body: `{"model":"m","messages":[{}],"best_of":5}`, want: Request{Model: "m"}},
		{name: "n is no embeddings field", ep: EndpointEmbeddings,
			body: `{"model":"m","input":"text","n":3}`, want: Request{Model: "m"}},
		{name: "n null", ep: EndpointChat,
			body: `{"model":"m","messages":[{}],"n":null}`, want: Request{Model: "m"}},
		{name: "n zero", ep: EndpointChat, body: `{"model":"m","messages":[{}],"n":0}`, wantParam: "n", wantErr: "positive integer"},
		{name: "n a string", ep: EndpointChat, body: `{"model":"m","messages":[{}],"n":"16"}`, wantParam: "n", wantErr: "integer"},
		{name: "n repeated", ep: EndpointChat, body: `{"model":"m","messages":[{}],"n":1,"n":64}`, wantParam: "n", wantErr: "repeats the key 'n'"},
		{name: "best_of repeated", ep: EndpointCompletions, body: `{"model":"m","prompt":"x","best_of":1,"best_of":64}`, wantParam: "best_of", wantErr: "repeats"},

		{name: "empty body", ep: EndpointChat, body: ``, wantErr: "empty"},
		{name: "malformed JSON", ep: EndpointChat, body: `{"model":"m",`, wantErr: "could not parse the JSON"},
		{name: "trailing garbage", ep: EndpointChat, body: `{"model":"m","messages":[{}]} x`, wantErr: "could not parse the JSON"},
		{name: "not an object", ep: EndpointChat, body: `[1,2]`, wantErr: "must be a JSON object"},
		{name: "kv_transfer_params from a client", ep: EndpointChat, body: `{"model":"m","messages":[{}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9"}}`, wantParam: "kv_transfer_params", wantErr: "set by the gateway"},
		{name: "kv_transfer_params escaped", ep: EndpointCompletions, body: `{"model":"m","prompt":"x","kv_transfer_p\u0061rams":null}`, wantParam: "kv_transfer_params", wantErr: "set by the gateway"},
		{name: "SGLang's bootstrap address", ep: EndpointChat, body: `{"model":"m","messages":[{}],"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":7}`, wantParam: "bootstrap_host", wantErr: "splits prefill from decode"},
		{name: "missing model", ep: EndpointChat, body: `{"messages":[{}]}`, wantParam: "model", wantErr: "model parameter"},
		{name: "model not a string", ep: EndpointChat, body: `{"model":3,"messages":[{}]}`, wantParam: "model"},
		{name: "missing messages", ep: EndpointChat, body: `{"model":"m"}`, wantParam: "messages", wantErr: "'messages'"},
		{name: "messages not array", ep: EndpointChat, body: `{"model":"m","messages":"hi"}`, wantParam: "messages"},
		{name: "messages empty", ep: EndpointChat, body: `{"model":"m","messages":[]}`, wantParam: "messages", wantErr: "at least one"},
		{name: "message not object", ep: EndpointChat, body: `{"model":"m","messages":["hi"]}`, wantParam: "messages"},
		{name: "stream not bool", ep: EndpointChat, body: `{"model":"m","messages":[{}],"stream":"yes"}`, wantParam: "stream"},
		{name: "include_usage not bool", ep: EndpointChat, body: `{"model":"m","messages":[{}],"stream_options":{"include_usage":1}}`, wantParam: "stream_options.include_usage"},
		{name: "stream_options not object", ep: EndpointChat, body: `{"model":"m","messages":[{}],"stream_options":true}`, wantParam: "stream_options"},
		{name: "max_tokens negative", ep: EndpointChat, body: `{"model":"m","messages":[{}],"max_tokens":-1}`, wantParam: "max_tokens"},
		{name: "max_tokens fraction", ep: EndpointChat, body: `{"model":"m","messages":[{}],"max_tokens":1.5}`, wantParam: "max_tokens"},
		{name: "missing prompt", ep: EndpointCompletions, body: `{"model":"m","messages":[{}]}`, wantParam: "prompt"},
		{name: "prompt number", ep: EndpointCompletions, body: `{"model":"m","prompt":5}`, wantParam: "prompt"},
		{name: "missing input", ep: EndpointEmbeddings, body: `{"model":"m"}`, wantParam: "input"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.ep, []byte(tc.body))
			if tc.wantErr != "" || tc.wantParam != "" {
				e, ok := err.(*Error)
				if !ok {
					t.Fatalf("err = %v (%T), want *Error", err, err)
				}
				if e.Status != http.StatusBadRequest || e.Type != TypeInvalidRequest {
					t.Errorf("status/type = %d/%s", e.Status, e.Type)
				}
				if tc.wantParam != "" && e.Param != tc.wantParam {
					t.Errorf("param = %q, want %q", e.Param, tc.wantParam)
				}
				if !strings.Contains(e.Message, tc.wantErr) {
					t.Errorf("message %q lacks %q", e.Message, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.Prompt == nil {
				t.Error("Prompt not captured")
			}
			if !json.Valid(got.Prompt) || !strings.Contains(tc.body, string(got.Prompt)) {
				t.Errorf("prompt %q is not a value of the body", got.Prompt)
			}
			if tc.want.Choices == 0 {
				tc.want.Choices = 1 // one sequence unless the body asks for more
			}
			read := Request{Model: got.Model, Stream: got.Stream, IncludeUsage: got.IncludeUsage,
				MaxTokens: got.MaxTokens, Choices: got.Choices, User: got.User}
			if !reflect.DeepEqual(read, tc.want) {
				t.Errorf("got %+v, want %+v", read, tc.want)
			}
		})
	}
}

func TestRewrite(t *testing.T) {
	tests := []struct {
		name        string
		body        string
		model       string
		inject      bool
		wantModel   string
		wantInclude any
	}{
		{"rename only", `{"model":"alias","messages":[{"role":"user","content":"x\u00e9\n"}]}`, "meta/Llama-3", false, "meta/Llama-3", nil},
		{"inject without stream_options", `{"model":"m","stream":true,"messages":[]}`, "", true, "m", true},
		{"inject over false", `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, "", true, "m", true},
		{"inject over null", `{"model":"m","stream":true,"stream_options":null}`, "", true, "m", true},
		{"control characters survive the rewrite", `{"model":"m","prompt":["\u001b[31m\u0000x"],"stream":true}`, "n", true, "n", true},
		{"inject keeps other options", `{"model":"m","stream_options":{"continuous_usage_stats":true}}`, "x\"y", true, "x\"y", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			if !strings.Contains(body, `"prompt"`) {
				body = strings.Replace(body, `"model"`, `"prompt":"p","model"`, 1)
			}
			req, err := ParseRequest(EndpointCompletions, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			out := req.Rewrite(nil, Edits{Model: tc.model, IncludeUsage: tc.inject})
			req.Release()
			var doc map[string]any
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatalf("rewritten body is not JSON: %v\n%s", err, out)
			}
			if strings.Contains(tc.body, "content") && !strings.Contains(string(out), `"x\u00e9\n"`) {
				t.Errorf("prompt string escapes not kept verbatim: %s", out)
			}
			if doc["model"] != tc.wantModel {
				t.Errorf("model = %v, want %v", doc["model"], tc.wantModel)
			}
			if tc.wantInclude != nil {
				so, _ := doc["stream_options"].(map[string]any)
				if so["include_usage"] != tc.wantInclude {
					t.Errorf("stream_options = %v", doc["stream_options"])
				}
				if strings.Contains(tc.body, "continuous_usage_stats") && so["continuous_usage_stats"] != true {
					t.Error("other stream_options lost")
				}
			}
		})
	}
}

func TestErrorBodyShape(t *testing.T) {
	for _, e := range []*Error{BadRequest("messages", "bad"), InvalidAPIKey(true), ModelNotFound("x"), ModelForbidden("x"),
		BodyTooLarge(10), NotFound("GET", "/x"), NoCapacity("m"), Internal("boom")} {
		var env struct {
			Error struct {
				Message *string `json:"message"`
				Type    *string `json:"type"`
				Code    any     `json:"code"`
				Param   any     `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(e.Body(), &env); err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		if env.Error.Message == nil || *env.Error.Message == "" || env.Error.Type == nil || *env.Error.Type == "" {
			t.Errorf("incomplete error body: %s", e.Body())
		}
		if !strings.Contains(string(e.Body()), `"code":`) || !strings.Contains(string(e.Body()), `"param":`) {
			t.Errorf("code/param keys missing: %s", e.Body())
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, uint8(1))
	f.Add(`{"model":"m","prompt":"x","max_tokens":3}`, uint8(2))
	f.Add(`{"model":"m","input":["a"],"stream_options":{"include_usage":false}}`, uint8(3))
	f.Add(`{"model":"\u00e9","messages":[{}],"max_completion_tokens":1e3}`, uint8(1))
	f.Add(`{"model":"m","prompt":["\u001b[31mred\u0000"],"stream":true}`, uint8(2))
	f.Add("{\"model\":\"m\",\"input\":\"\xff\xfe\"}", uint8(3))
	f.Add(`{"model":"m","prompt":"x","n":3,"best_of":4,"max_tokens":2}`, uint8(2))
	f.Fuzz(func(t *testing.T, body string, ep uint8) {
		endpoint := []Endpoint{EndpointChat, EndpointCompletions, EndpointEmbeddings, EndpointResponses}[ep%4]
		req, err := ParseRequest(endpoint, []byte(body))
		if err != nil {
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("non-API error %T: %v", err, err)
			}
			// Only what a validator refuses, nests too deep or holds an overlong number is refused as not JSON.
			if strings.Contains(e.Message, "could not parse") && !strings.Contains(e.Message, "nesting deeper") &&
				!strings.Contains(e.Message, "number longer") && json.Valid([]byte(body)) {
				t.Fatalf("refused valid JSON %q: %s", body, e.Message)
			}
			return
		}
		if req.Model == "" || req.Prompt == nil {
			t.Fatalf("accepted request without model or prompt: %q", body)
		}
		// The scan is as strict as a validator (scan.go).
		if !json.Valid([]byte(body)) {
			t.Fatalf("accepted a body the JSON validator refuses: %q", body)
		}
		_ = req.ConversationKey() // must not panic on any accepted prompt
		// The prompt read in place is the prompt a JSON decoder reads.
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatalf("accepted body does not decode: %v", err)
		}
		if want := doc[endpoint.promptField()]; !bytes.Equal(compactJSON(t, req.Prompt), compactJSON(t, want)) {
			t.Fatalf("prompt %q of %q is not the prompt %s", req.Prompt, body, want)
		}
		out := req.Rewrite(nil, Edits{Model: "renamed", IncludeUsage: true})
		req.Release()
		if !json.Valid(out) {
			t.Fatalf("Rewrite produced invalid JSON from %q: %q", body, out)
		}
		again, err := ParseRequest(endpoint, out)
		if err != nil || again.Model != "renamed" || !again.IncludeUsage {
			t.Fatalf("rewritten body does not parse back: %v %+v from %q", err, again, out)
		}
	})
}

func compactJSON(t *testing.T, js []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, js); err != nil {
		t.Fatalf("not JSON: %q: %v", js, err)
	}
	return b.Bytes()
}

// Reading the prompt's strings (as the prefix hasher does) leaves the body as sent: the rewrite keeps control
// characters escaped as the client escaped them and invalid UTF-8 as it was.
func TestRewriteAfterStringsWereRead(t *testing.T) {
	body := []byte("{\"model\":\"m\",\"prompt\":[\"\\u001b[31mred\\u0000\", \"\xff\"],\"stream\":true}")
	req, err := ParseRequest(EndpointCompletions, body)
	if err != nil {
		t.Fatal(err)
	}
	for c := Elements(req.Prompt); ; {
		v, ok := c.Next()
		if !ok {
			break
		}
		_, _ = StringValue(v)
	}
	out := req.Rewrite(nil, Edits{Model: "renamed", IncludeUsage: true})
	req.Release()
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("rewritten body is not JSON: %v\n%q", err, out)
	}
	if doc["model"] != "renamed" || doc["stream_options"].(map[string]any)["include_usage"] != true {
		t.Errorf("rewrite lost: %s", out)
	}
	if !strings.Contains(string(out), `\u001b[31mred\u0000`) {
		t.Errorf("prompt bytes changed: %q", out)
	}
}

func TestModelID(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/models/llama-70b": "llama-70b", "/v1/models/meta-llama/Llama-3.3?x=1": "meta-llama/Llama-3.3",
		"/v1/models/a%2Fb": "a/b", "/v1/models/bad%zz": "", "/v1/models/a%0Db": "", "/v1/models": "", "/v1/chat/completions": "",
	} {
		if got := ModelID(path); got != want {
			t.Errorf("ModelID(%q) = %q, want %q", path, got, want)
		}
	}
}

// A body's rewrite gives way every copyEvery bytes and writes what Rewrite writes; an ordinary body's never
// does.
func TestLargeBodiesYieldWhileRewritten(t *testing.T) {
	text := func(n int) []byte {
		head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
	}
	edits := Edits{Model: "renamed", IncludeUsage: true, MaxTokens: 9}
	for _, tc := range []struct {
		name     string
		body     []byte
		min, max int
	}{
		{"64 KiB", text(LargeBodyBytes), 0, 0},
		{"256 KiB", text(copyEvery), 0, 0},
		{"257 KiB", text(copyEvery + 1<<10), 1, 1},
		{"4 MiB", text(4 << 20), 15, 16},
	} {
		req, err := ParseRequest(EndpointChat, tc.body)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		yields := 0
		got := req.RewriteYielding(nil, edits, func() { yields++ })
		if want := req.Rewrite(nil, edits); !bytes.Equal(got, want) {
			t.Errorf("%s: yielding rewrite differs from Rewrite's", tc.name)
		}
		if yields < tc.min || yields > tc.max {
			t.Errorf("%s: %d yields, want %d-%d", tc.name, yields, tc.min, tc.max)
		}
		req.Release()
	}
}
