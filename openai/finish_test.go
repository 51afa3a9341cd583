package openai

import (
	"os"
	"testing"
)

func TestFinishReasonOfABody(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm-chat-completion.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"vLLM's answer", string(vllm), FinishStop},
		{"cut at max_tokens", `{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"length"}]}`, FinishLength},
		{"tool call", `{"choices":[{"index":0,"finish_reason":"tool_calls"}]}`, FinishToolCalls},
		{"an engine's own word", `{"choices":[{"index":0,"finish_reason":"abort"}]}`, FinishOther},
		{"the first choice that has one", `{"choices":[{"index":0,"finish_reason":null},{"index":1,"finish_reason":"content_filter"}]}`, FinishContentFilter},
		{"not a string", `{"choices":[{"index":0,"finish_reason":7}]}`, ""},
		{"none", `{"choices":[]}`, ""},
		{"Responses API, completed", `{"object":"response","status":"completed","output":[]}`, FinishStop},
		{"Responses API, out of tokens", `{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}`, FinishLength},
		{"Responses API, filtered", `{"status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}`, FinishContentFilter},
		{"Responses API, failed", `{"status":"failed","output":[]}`, ""},
		{"not JSON", `{"choices":`, ""},
	} {
		if got := FinishReason([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A stream's finish reason is read across any cut of its chunks.
func TestFinishReasonOfAStream(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm-chat-stream.sse")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, stream, want string }{
		{"vLLM's stream", string(vllm), FinishStop},
		{"cut at max_tokens", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n", FinishLength},
		{"never finished", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n", ""},
		{"Responses API", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}\n\n", FinishStop},
		{"Responses API, incomplete", "data: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n", FinishLength},
	} {
		for _, cut := range []int{1, 7, 64, len(tc.stream)} {
			var s SSEScanner
			rest := tc.stream
			for len(rest) > 0 {
				n := min(cut, len(rest))
				s.Process([]byte(rest[:n]), n == len(rest))
				rest = rest[n:]
			}
			if got := s.FinishReason(); got != tc.want {
				t.Errorf("%s in chunks of %d: %q, want %q", tc.name, cut, got, tc.want)
			}
		}
	}
}
