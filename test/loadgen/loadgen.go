// Package loadgen holds what the demo and the benchmarks share to drive traffic: a streaming chat request
// that measures time to first token and reads the usage, and a throwaway redis-server.
package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// Result is one streaming request as the client saw it.
type Result struct {
	Status  int
	Replica string // x-simulated-replica, when the simulated fleet answered
	TTFT    time.Duration
	// Last is when the last chunk carrying content arrived, from the request's start.
	Last       time.Duration
	Prompt     int64
	Cached     int64
	Completion int64
	Usage      bool // a usage chunk arrived
}

// StreamChat posts a streaming chat body (which should ask for stream_options.include_usage) and reads the
// server-sent events to the end.
func StreamChat(ctx context.Context, client *http.Client, url string, header http.Header, body []byte) Result {
	return StreamChatWith(ctx, client, url, header, body, nil)
}

// StreamChatWith is StreamChat that calls firstToken (when not nil) as the first chunk with content arrives:
// a benchmark's router stands where the gateway does, and tells its picker the prompt is prefilled then, as
// the data plane does (picker.Picker.Prefilled).
func StreamChatWith(ctx context.Context, client *http.Client, url string, header http.Header, body []byte, firstToken func()) Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return Result{}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Result{}
	}
	defer resp.Body.Close()
	r := Result{Status: resp.StatusCode, Replica: resp.Header.Get("x-simulated-replica")}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				PromptTokens        int64 `json:"prompt_tokens"`
				CompletionTokens    int64 `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if len(chunk.Choices) > 0 {
			r.Last = time.Since(start)
			if r.TTFT == 0 {
				r.TTFT = r.Last
				if firstToken != nil {
					firstToken()
				}
			}
		}
		if u := chunk.Usage; u != nil {
			r.Prompt, r.Completion, r.Cached, r.Usage = u.PromptTokens, u.CompletionTokens, u.PromptTokensDetails.CachedTokens, true
		}
	}
	return r
}

// StartRedis runs a redis-server with persistence off on a free loopback port; stop kills it.
func StartRedis() (addr string, stop func(), err error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return "", nil, errors.New("redis-server is not installed (make test-deps installs it)")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr = lis.Addr().String()
	lis.Close()
	_, port, _ := net.SplitHostPort(addr)
	dir, err := os.MkdirTemp("", "infergate-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, stop, nil
		}
		if i > 250 {
			stop()
			return "", nil, errors.New("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Median is the median of one metric over benchmark runs (the upper one of an even count): the benchmarks
// report medians, as single runs on a shared machine are noisy.
func Median[R any](runs []R, metric func(R) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = metric(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// Check prints one benchmark target as "- what: figures — met" (or NOT MET), the form BENCHMARKS.md records.
func Check(what string, met bool, format string, args ...any) {
	verdict := "NOT MET"
	if met {
		verdict = "met"
	}
	fmt.Printf("- %s: %s — %s\n", what, fmt.Sprintf(format, args...), verdict)
}

// Selected says whether a benchmark row runs under a -policies flag: every row when list is empty, the
// baseline always (its figures are what the others are compared with), otherwise the comma-separated names.
func Selected(list, name, baseline string) bool {
	if list == "" || name == baseline {
		return true
	}
	for _, n := range strings.Split(list, ",") {
		if strings.TrimSpace(n) == name {
			return true
		}
	}
	return false
}
