package extproc

import (
	"os"
	"strings"
	"testing"

	"github.com/infergate/infergate/policies"
)

// With spec.gateway.responseModel: requested, responses name the model as the client asked for it (an alias
// stays an alias) in every response body mode, streamed or whole; nothing else of the body changes.
func TestResponsesNameTheRequestedModel(t *testing.T) {
	src, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    tenantHeader: true\n", "    tenantHeader: true\n    responseModel: requested\n", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{})
	const served = "meta-llama/Llama-3.3-70B-Instruct"
	sse := "data: {\"id\":\"c\",\"model\":\"" + served + "\",\"choices\":[{\"delta\":{\"content\":\"the \\\"model\\\": key\"}}]}\n\n" +
		"data: {\"id\":\"c\",\"model\":\"" + served + "\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n" +
		"data: [DONE]\n\n"
	whole := `{"id":"c","object":"chat.completion","model":"` + served + `","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`
	for _, tc := range []struct {
		name   string
		mode   bodyMode
		stream bool
	}{
		{"streamed sse", modeStreamed, true}, {"full-duplex sse", modeFullDuplex, true}, {"buffered sse", modeBuffered, true},
		{"streamed json", modeStreamed, false}, {"full-duplex json", modeFullDuplex, false}, {"buffered json", modeBuffered, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := h.open(t, modeFullDuplex, tc.mode)
			body := `{"model":"llama-70b","stream":` + map[bool]string{true: "true", false: "false"}[tc.stream] +
				`,"messages":[{"role":"user","content":"hi"}]}`
			s.send(postHeaders("/v1/chat/completions", keyAcme))
			s.send(reqBody([]byte(body), true))
			s.recv()
			s.recvStreamed(true, 4)
			upstream, ctype := whole, "application/json"
			if tc.stream {
				upstream, ctype = sse, "text/event-stream"
			}
			s.send(respHeaders("200", false, "content-type", ctype, "content-length", "999"))
			if rm := s.recv().GetResponseHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(); !strings.Contains(strings.Join(rm, ","), "content-length") {
				t.Errorf("content-length kept although the body changes: %v", rm)
			}
			var got []byte
			chunks := []string{upstream[:20], upstream[20:]}
			switch tc.mode {
			case modeFullDuplex:
				s.send(respBody([]byte(chunks[0]), false))
				s.send(respBody([]byte(chunks[1]), true))
				got = s.recvStreamed(false, 8)
			case modeStreamed:
				for i, c := range chunks {
					s.send(respBody([]byte(c), i == 1))
					got = s.forwardedChunk(got, []byte(c))
				}
			default:
				s.send(respBody([]byte(upstream), true))
				got = s.forwardedChunk(nil, []byte(upstream))
			}
			want := strings.ReplaceAll(upstream, `"model":"`+served+`"`, `"model":"llama-70b"`)
			if tc.stream {
				want = strings.Replace(want, "data: {\"id\":\"c\",\"model\":\"llama-70b\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n", "", 1)
			}
			if string(got) != want {
				t.Errorf("client got\n%s\nwant\n%s", got, want)
			}
		})
	}
}
