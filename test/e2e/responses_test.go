package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/infergate/infergate/director"
)

// The Responses API through the data plane with the openai-go client, whole and streamed: routed like chat
// (an alias resolves, the body's model is the pool's), answered, and settled on the usage the engine reported.
func TestResponsesAPIThroughGateway(t *testing.T) {
	for _, name := range []string{"full-duplex", "buffered"} {
		t.Run(name, func(t *testing.T) {
			st := startStack(t, envoyConfigs[name])
			c := client(st, "sk-demo-acme")
			ctx := context.Background()
			params := responses.ResponseNewParams{
				Model:           "llama-70b",
				Instructions:    openai.String("You are terse."),
				Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Say hi.")},
				MaxOutputTokens: openai.Int(6),
			}
			resp, err := c.Responses.New(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if resp.OutputText() == "" || resp.Usage.OutputTokens != 6 || resp.Model != "meta-llama/Llama-3.3-70B-Instruct" {
				t.Errorf("response %q, usage %+v, model %s", resp.OutputText(), resp.Usage, resp.Model)
			}
			st1 := settled(t, st)
			if !st1.Reported || st1.Usage.CompletionTokens != 6 || st1.Usage.PromptTokens != resp.Usage.InputTokens || st1.Model != llama {
				t.Errorf("settled %+v", st1)
			}

			stream := c.Responses.NewStreaming(ctx, params)
			var text string
			var completed int64
			for stream.Next() {
				ev := stream.Current()
				switch ev.Type {
				case "response.output_text.delta":
					text += ev.Delta
				case "response.completed":
					completed = ev.Response.Usage.OutputTokens
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if text == "" || completed != 6 {
				t.Errorf("streamed %q, completed with %d output tokens", text, completed)
			}
			if st2 := settled(t, st); !st2.Reported || st2.Usage.CompletionTokens != 6 || !st2.Timing.Chunked && name == "full-duplex" {
				t.Errorf("settled stream %+v", st2)
			}
		})
	}
}

func settled(t *testing.T, st *Stack) director.Settlement {
	t.Helper()
	select {
	case s := <-st.Settled:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no settlement")
	}
	return director.Settlement{}
}
