package openai

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestResponsesRequest(t *testing.T) {
	if EndpointForPath("/v1/responses") != EndpointResponses || EndpointResponses.String() != "responses" {
		t.Fatal("the Responses API path is not routed")
	}
	body := []byte(`{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"}],"max_output_tokens":50,"stream":true}`)
	req, err := ParseRequest(EndpointResponses, body)
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	if req.Model != "m" || !req.Stream || req.MaxTokens != 50 || req.Prompt == nil || string(req.Instructions) != `"be brief"` {
		t.Errorf("parsed %+v", req)
	}
	if got := string(req.Prompt); got != `[{"role":"user","content":"hi"}]` {
		t.Errorf("prompt %s", got)
	}
	for _, bad := range []string{
		`{"model":"m","input":"x","instructions":5}`,
		`{"model":"m","input":"x","max_output_tokens":0}`,
		`{"model":"m","input":{"role":"user"}}`,
		`{"model":"m"}`,
		`{"model":"m","input":"x","max_output_tokens":5,"max_output_tokens":6}`,
	} {
		if r, err := ParseRequest(EndpointResponses, []byte(bad)); err == nil {
			r.Release()
			t.Errorf("%s accepted", bad)
		}
	}
}

// The output bound written into a Responses API body is max_output_tokens, the field it reads.
func TestResponsesRewriteBound(t *testing.T) {
	req, err := ParseRequest(EndpointResponses, []byte(`{"model":"m","input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	out := req.Rewrite(nil, Edits{Model: "served", MaxTokens: 64})
	req.Release()
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil || doc["max_output_tokens"] != float64(64) || doc["max_tokens"] != nil || doc["model"] != "served" {
		t.Errorf("rewritten %s", out)
	}
}

func TestResponsesUsageAndText(t *testing.T) {
	whole := []byte(`{"id":"resp_1","object":"response","model":"m","output":[{"type":"message","role":"assistant",` +
		`"content":[{"type":"output_text","text":"Hel"},{"type":"output_text","text":"lo"}]}],` +
		`"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":2,"total_tokens":14}}`)
	u, ok := UsageFromJSON(whole)
	if !ok || u.PromptTokens != 12 || u.CompletionTokens != 2 || u.CachedTokens != 8 || !u.CachedReported {
		t.Errorf("usage %+v %v", u, ok)
	}
	var b bytes.Buffer
	OutputText(whole, &b)
	if b.String() != "Hello" {
		t.Errorf("text %q", b.String())
	}
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"m\"}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hel\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"lo\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":2}}}\n\n"
	var text bytes.Buffer
	s := &SSEScanner{Text: &text}
	if out := s.Process([]byte(stream), true); string(out) != stream {
		t.Error("the stream changed")
	}
	if u, ok := s.Usage(); !ok || u.PromptTokens != 12 || u.CompletionTokens != 2 || s.ContentEvents() != 2 || text.String() != "Hello" {
		t.Errorf("usage %+v %v, %d content events, text %q", u, ok, s.ContentEvents(), text.String())
	}
}
