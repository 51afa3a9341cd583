package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// StreamChatWith calls firstToken once, when the first chunk with choices arrives (a vLLM-style server sends its
// role chunk with the first token), before the rest of the stream: the benchmarks' routers tell their picker the
// prompt is prefilled then.
func TestStreamChatWithHearsTheFirstToken(t *testing.T) {
	second := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-second // the rest only once the client has heard the first token
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	calls := 0
	res := StreamChatWith(context.Background(), srv.Client(), srv.URL, nil, []byte(`{}`), func() {
		calls++
		close(second)
	})
	if calls != 1 || !res.Usage || res.Completion != 2 {
		t.Errorf("firstToken called %d times, usage %v, %d completion tokens: want once, and the whole stream read", calls, res.Usage, res.Completion)
	}
}
