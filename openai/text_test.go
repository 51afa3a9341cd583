package openai

import (
	"bytes"
	"strings"
	"testing"
)

// The prompt is read where it lies: its bytes are the client's, spacing and escapes included, however its
// key is written.
func TestPromptIsTheClientsBytes(t *testing.T) {
	cases := []struct {
		ep         Endpoint
		body, want string
	}{
		{EndpointChat, `{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"q\""}]}`, `[{"role":"user","content":"caf\u00e9 \"q\""}]`},
		{EndpointChat, "{\"messages\" : [ {\"role\": \"user\",\n \"content\":\"hi\"} ] , \"model\":\"m\"}", "[ {\"role\": \"user\",\n \"content\":\"hi\"} ]"},
		{EndpointChat, `{"model":"m","meta":{"messages":"decoy"},"messages":[{"content":"real"}]}`, `[{"content":"real"}]`},
		{EndpointChat, `{"model":"messages","messages":[{}]}`, `[{}]`},
		{EndpointCompletions, `{"model":"m","prompt":"once upon"}`, `"once upon"`},
		{EndpointEmbeddings, `{"model":"m","input":["a","b"]}`, `["a","b"]`},
		{EndpointChat, `{"model":"m","messag\u0065s":[{"content":"x"}]}`, `[{"content":"x"}]`},
	}
	for _, c := range cases {
		req, err := ParseRequest(c.ep, []byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.body, err)
			continue
		}
		if got := string(req.Prompt); got != c.want {
			t.Errorf("prompt of %s = %s, want %s", c.body, got, c.want)
		}
	}
}

func TestOutputText(t *testing.T) {
	var b bytes.Buffer
	OutputText([]byte(`{"choices":[{"message":{"role":"assistant","content":"Hel\u006co"}},{"message":{"content":" there"}}],"usage":{}}`), &b)
	if b.String() != "Hello there" {
		t.Errorf("chat text %q", b.String())
	}
	b.Reset()
	OutputText([]byte(`{"choices":[{"text":"abc"}]}`), &b)
	if b.String() != "abc" {
		t.Errorf("completion text %q", b.String())
	}
	b.Reset()
	OutputText([]byte(`{"data":[{"embedding":[1,2]}]}`), &b)
	if b.Len() != 0 {
		t.Errorf("embeddings text %q", b.String())
	}
}

func TestSSEScannerText(t *testing.T) {
	var b bytes.Buffer
	s := &SSEScanner{Text: &b, DropUsageChunk: true}
	stream := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"lo\\n\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	// Split mid-event: the text does not depend on chunk boundaries.
	for _, part := range []string{stream[:30], stream[30:77], stream[77:]} {
		s.Process([]byte(part), false)
	}
	s.Process(nil, true)
	if b.String() != "Hello\n" {
		t.Errorf("text %q, want %q", b.String(), "Hello\n")
	}
}

func TestAppendRenamedModel(t *testing.T) {
	q := []byte(`"llama-70b"`)
	cases := []struct{ in, want string }{
		{`{"id":"x","model":"meta-llama/Llama-3.3-70B-Instruct","choices":[]}`, `{"id":"x","model":"llama-70b","choices":[]}`},
		{`data: {"model" : "a\"b", "x":1}` + "\n", `data: {"model" : "llama-70b", "x":1}` + "\n"},
		// "model" inside generated text is escaped: not a key.
		{`{"choices":[{"delta":{"content":"the \"model\":\"x\" key"}}],"model":"m"}`, `{"choices":[{"delta":{"content":"the \"model\":\"x\" key"}}],"model":"llama-70b"}`},
		{`{"model":null}`, `{"model":null}`},
		{`{"models":"x"}`, `{"models":"x"}`},
		{`data: [DONE]`, `data: [DONE]`},
		{`{"model":"unterminated`, `{"model":"unterminated`},
	}
	for _, c := range cases {
		if got := string(AppendRenamedModel(nil, []byte(c.in), q)); got != c.want {
			t.Errorf("AppendRenamedModel(%s) = %s, want %s", c.in, got, c.want)
		}
	}
}

// A renamed stream is the same stream but for the model's value, however it was cut.
func TestSSEScannerRenamesModel(t *testing.T) {
	stream := "data: {\"model\":\"served\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"model\":\"served\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n" +
		"data: [DONE]\n\n"
	for _, drop := range []bool{false, true} {
		for cut := 0; cut <= len(stream); cut += 7 {
			s := &SSEScanner{DropUsageChunk: drop, RenameModel: []byte(`"asked"`)}
			out := append(s.Process([]byte(stream[:cut]), false), s.Process([]byte(stream[cut:]), true)...)
			want := strings.ReplaceAll(stream, `"served"`, `"asked"`)
			if drop {
				want = strings.Replace(want, "data: {\"model\":\"asked\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n", "", 1)
			}
			if string(out) != want {
				t.Fatalf("drop=%v cut=%d:\n%q\nwant\n%q", drop, cut, out, want)
			}
		}
	}
}
