package e2e

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const (
	llama = "llama-3.3-70b"
	qwen  = "qwen2.5-7b"
)

// envoyConfigs are the shipped Envoy configurations; every test runs under both body modes, and with clusters
// and routes taken from infergate's control plane over ADS.
var envoyConfigs = map[string]string{
	"full-duplex": "deploy/envoy/envoy.yaml",
	"buffered":    "deploy/envoy/envoy-buffered.yaml",
	"xds":         "deploy/envoy/envoy-xds.yaml",
}

func startStack(t *testing.T, envoyFile string) *Stack {
	t.Helper()
	root, err := FindRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := Start(ctx, Options{Root: root, EnvoyFile: envoyFile, PolicyFile: "examples/quickstart/policy.yaml",
		FleetFile: "examples/quickstart/fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func client(st *Stack, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(st.URL+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
}

func chatParams(model, system, user string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		MaxTokens: openai.Int(6),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(user)},
	}
}

func TestOpenAIClientThroughGateway(t *testing.T) {
	for mode, file := range envoyConfigs {
		t.Run(mode, func(t *testing.T) {
			st := startStack(t, file)
			c := client(st, "sk-demo-acme")
			ctx := context.Background()

			t.Run("chat", func(t *testing.T) {
				var httpResp *http.Response
				resp, err := c.Chat.Completions.New(ctx, chatParams("llama-70b", "You are terse.", "Say hi."), option.WithResponseInto(&httpResp))
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != 6 || resp.Usage.PromptTokens == 0 {
					t.Errorf("response %+v", resp)
				}
				if replica := httpResp.Header.Get("x-simulated-replica"); !strings.HasPrefix(replica, "llama70b-") {
					t.Errorf("served by %q, want a llama replica (alias resolved, body rewritten)", replica)
				}
				if resp.Model != "meta-llama/Llama-3.3-70B-Instruct" {
					t.Errorf("model %q: the pool's served name", resp.Model)
				}
			})

			t.Run("streaming chat with usage", func(t *testing.T) {
				params := chatParams(qwen, "You are terse.", "Count.")
				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
				stream := c.Chat.Completions.NewStreaming(ctx, params)
				acc := openai.ChatCompletionAccumulator{}
				sawUsageChunk := false
				for stream.Next() {
					chunk := stream.Current()
					acc.AddChunk(chunk)
					if len(chunk.Choices) == 0 && chunk.Usage.TotalTokens > 0 {
						sawUsageChunk = true
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatal(err)
				}
				if !sawUsageChunk || acc.Usage.CompletionTokens != 6 || acc.Choices[0].Message.Content == "" {
					t.Errorf("usage chunk %v, usage %+v, content %q", sawUsageChunk, acc.Usage, acc.Choices[0].Message.Content)
				}
			})

			t.Run("streaming chat without usage is settled anyway", func(t *testing.T) {
				drain(st)
				stream := c.Chat.Completions.NewStreaming(ctx, chatParams(qwen, "You are terse.", "Count again."))
				chunks := 0
				for stream.Next() {
					chunk := stream.Current()
					if len(chunk.Choices) == 0 {
						t.Error("the client received the usage chunk it did not ask for")
					}
					chunks++
				}
				if err := stream.Err(); err != nil || chunks == 0 {
					t.Fatalf("%d chunks, %v", chunks, err)
				}
				s := waitSettlement(t, st)
				if !s.Reported || s.Usage.CompletionTokens != 6 || s.Tenant != "acme" || s.Model != qwen {
					t.Errorf("settlement %+v", s)
				}
			})

			t.Run("completions", func(t *testing.T) {
				resp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(qwen),
					Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")}, MaxTokens: openai.Int(4)})
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Choices) != 1 || resp.Usage.CompletionTokens != 4 {
					t.Errorf("completion %+v", resp)
				}
			})

			t.Run("embeddings", func(t *testing.T) {
				resp, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: qwen,
					Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("embed this sentence")}, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat})
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Data) != 1 || len(resp.Data[0].Embedding) == 0 || resp.Usage.PromptTokens == 0 {
					t.Errorf("embeddings %+v", resp)
				}
			})

			t.Run("models list", func(t *testing.T) {
				page, err := c.Models.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, m := range page.Data {
					ids = append(ids, m.ID)
				}
				// Every name the tenant may call, aliases too.
				if !slices.Equal(ids, []string{llama, "llama-70b", qwen, "qwen-7b"}) {
					t.Errorf("models %v", ids)
				}
				initech := client(st, "sk-demo-initech")
				page, err = initech.Models.List(ctx)
				if err != nil || len(page.Data) != 2 || page.Data[0].ID != qwen || page.Data[1].ID != "qwen-7b" {
					t.Errorf("initech models %+v %v", page, err)
				}
			})

			t.Run("errors", func(t *testing.T) {
				huge := strings.Repeat("lorem ipsum ", 5<<20/12)
				tests := []struct {
					name   string
					client openai.Client
					params openai.ChatCompletionNewParams
					status int
					code   string
					typ    string
				}{
					{"401 unknown key", client(st, "sk-wrong"), chatParams(qwen, "s", "u"), 401, "invalid_api_key", "invalid_request_error"},
					{"403 model not allowed", client(st, "sk-demo-initech"), chatParams(llama, "s", "u"), 403, "model_not_allowed", "permission_error"},
					{"404 unknown model", c, chatParams("gpt-9", "s", "u"), 404, "model_not_found", "invalid_request_error"},
					{"400 no messages", c, openai.ChatCompletionNewParams{Model: qwen}, 400, "invalid_request", "invalid_request_error"},
					{"413 body over the limit", c, chatParams(qwen, huge, "u"), 413, "request_too_large", "invalid_request_error"},
				}
				for _, tc := range tests {
					t.Run(tc.name, func(t *testing.T) {
						cl := tc.client
						_, err := cl.Chat.Completions.New(ctx, tc.params)
						var apiErr *openai.Error
						if !errors.As(err, &apiErr) {
							t.Fatalf("want *openai.Error, got %v", err)
						}
						if apiErr.StatusCode != tc.status || apiErr.Code != tc.code || apiErr.Type != tc.typ || apiErr.Message == "" {
							t.Errorf("got %d code=%q type=%q message=%q", apiErr.StatusCode, apiErr.Code, apiErr.Type, apiErr.Message)
						}
					})
				}
			})
		})
	}
}

func drain(st *Stack) {
	for {
		select {
		case <-st.Settled:
		default:
			return
		}
	}
}

func waitSettlement(t *testing.T, st *Stack) (s struct {
	Reported bool
	Usage    struct{ CompletionTokens int64 }
	Tenant   string
	Model    string
}) {
	t.Helper()
	select {
	case got := <-st.Settled:
		s.Reported, s.Usage.CompletionTokens, s.Tenant, s.Model = got.Reported, got.Usage.CompletionTokens, got.Tenant, got.Model
	case <-time.After(10 * time.Second):
		t.Fatal("no settlement")
	}
	return s
}

// scrapeSum sums a metric across the replicas whose names start with prefix (a histogram: its observations).
func scrapeSum(t *testing.T, st *Stack, prefix, metric string) float64 {
	t.Helper()
	total := 0.0
	for _, r := range st.Fleet.Replicas {
		if !strings.HasPrefix(r.Name(), prefix) {
			continue
		}
		resp, err := http.Get("http://" + r.Addr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fams[metric].GetMetric() {
			total += sampleValue(m)
		}
	}
	return total
}

// sampleValue is a counter's or gauge's value, or the sum of a histogram's observations.
func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetHistogram() != nil:
		return m.GetHistogram().GetSampleSum()
	}
	return m.GetGauge().GetValue()
}

// A repeated prefix is served from the replicas' KV cache: lower TTFT, and the prefix-cache metrics move.
func TestRepeatedPrefixLowersTTFT(t *testing.T) {
	st := startStack(t, envoyConfigs["full-duplex"])
	c := client(st, "sk-demo-globex")
	// Long enough (about 3,000 tokens) that a cold prefill dominates TTFT even on a busy machine.
	system := strings.Repeat("You are the support assistant of a large retailer; answer precisely and politely. ", 230)
	// TTFT as the engines measured it: the delta of their TTFT histograms' sums across one request, the only one
	// in flight. The client's clock would add the test process's own work (parsing, hashing, tokenising the
	// prompt in the race-built binary), which grows with the prompt as a cold prefill does, and on a busy machine
	// it swamped the difference (warm 110 ms against cold 139 ms in one run beside two CPU hogs).
	const ttftMetric = "vllm:time_to_first_token_seconds"
	engineTTFT := func(user string) time.Duration {
		before := scrapeSum(t, st, "qwen7b", ttftMetric)
		stream := c.Chat.Completions.NewStreaming(context.Background(), chatParams(qwen, system, user))
		defer stream.Close()
		for stream.Next() {
			if len(stream.Current().Choices) > 0 {
				return time.Duration((scrapeSum(t, st, "qwen7b", ttftMetric) - before) * float64(time.Second))
			}
		}
		t.Fatalf("no token: %v", stream.Err())
		return 0
	}
	hitsBefore := scrapeSum(t, st, "qwen7b", "vllm:prefix_cache_hits_total")
	// The first request is cold; prefix affinity sends the following ones to the replica that has the prefix.
	var cold, warm []time.Duration
	for i := range 6 {
		d := engineTTFT("question number " + string(rune('A'+i)))
		if i == 0 {
			cold = append(cold, d)
		} else if i >= 2 {
			warm = append(warm, d)
		}
	}
	hitsAfter := scrapeSum(t, st, "qwen7b", "vllm:prefix_cache_hits_total")
	if hitsAfter-hitsBefore < 1000 {
		t.Errorf("prefix cache hits moved by %v tokens, want the shared system prompt", hitsAfter-hitsBefore)
	}
	// A busy machine only delays an engine's steps, so the fastest warm request is the best reading of what a
	// warm prefix costs (the cold one, delayed too, only makes the comparison easier).
	t.Logf("engine TTFT: cold %v, warm %v", cold, warm)
	if fastest := slices.Min(warm); fastest <= 0 || fastest*2 > cold[0] {
		t.Errorf("engine TTFT warm %v (fastest %v) not well below cold %v", warm, fastest, cold)
	}
	if q := scrapeSum(t, st, "qwen7b", "vllm:prefix_cache_queries_total"); q <= hitsAfter {
		t.Errorf("queries %v must exceed hits %v (the cold requests missed)", q, hitsAfter)
	}
}

// Every response carries the request id infergate settled it under, as OpenAI's do; the official SDK reads it
// from the x-request-id header.
func TestResponsesCarryTheRequestID(t *testing.T) {
	st := startStack(t, "deploy/envoy/envoy-xds.yaml")
	var resp *http.Response
	c := client(st, "sk-demo-acme")
	if _, err := c.Chat.Completions.New(context.Background(), chatParams("qwen-7b", "s", "u"), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("x-request-id")
	if id == "" {
		t.Fatal("no x-request-id on a successful response")
	}
	select {
	case got := <-st.Settled:
		if got.RequestID != id {
			t.Errorf("settled as %q, answered as %q", got.RequestID, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no settlement")
	}
}
