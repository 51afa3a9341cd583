package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// outcome is how one request ended, as its client saw it.
type outcome int

const (
	ok       outcome = iota
	clearErr         // a response with a status and a body saying what went wrong
	lostReq          // no response, a cut stream, or a stream that never ended
	rejected         // the metered tenant's own quota refusal (429): expected, not an error
)

// result is one finished request.
type result struct {
	start, end time.Time
	outcome    outcome
	status     int
	tokens     int64 // usage the engine reported (metered requests)
	metered    bool
	detail     string
}

// load drives steady streaming traffic and a metered tenant, and records every request.
type load struct {
	s      *stack
	client *http.Client

	mu      sync.Mutex
	results []result
	workers atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup

	extra           func() // stops the overload scenario's extra workers
	hostileProblems []string

	nextID   int64
	inflight map[int64]time.Time // start of every request not finished yet
}

// begin notes a request in flight; done ends it.
func (l *load) begin(start time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextID++
	l.inflight[l.nextID] = start
	return l.nextID
}

func (l *load) done(id int64) {
	l.mu.Lock()
	delete(l.inflight, id)
	l.mu.Unlock()
}

// runningSince reports whether a request that started before t is still running.
func (l *load) runningSince(t time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.inflight {
		if s.Before(t) {
			return true
		}
	}
	return false
}

func newLoad(s *stack) *load {
	tr := &http.Transport{MaxIdleConnsPerHost: 256, ResponseHeaderTimeout: 30 * time.Second}
	return &load{s: s, client: &http.Client{Transport: tr, Timeout: 45 * time.Second}, stop: make(chan struct{}),
		inflight: map[int64]time.Time{}}
}

func (l *load) record(r result) {
	l.mu.Lock()
	l.results = append(l.results, r)
	l.mu.Unlock()
}

// between returns the results of requests that started in [from, to).
func (l *load) between(from, to time.Time) []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []result
	for _, r := range l.results {
		if !r.start.Before(from) && r.start.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// all returns every result so far.
func (l *load) all() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]result(nil), l.results...)
}

// addSteady starts n workers sending streaming chat requests in a loop (alternating models), until removed or
// stopped.
func (l *load) addSteady(n int) func() {
	quit := make(chan struct{})
	for i := range n {
		l.wg.Add(1)
		l.workers.Add(1)
		go func() {
			defer l.wg.Done()
			defer l.workers.Add(-1)
			for k := 0; ; k++ {
				select {
				case <-quit:
					return
				case <-l.stop:
					return
				default:
				}
				model := "llama"
				if (i+k)%2 == 1 {
					model = "qwen"
				}
				body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":16,"messages":[{"role":"system","content":"You are a careful assistant for group %d."},{"role":"user","content":"question %d"}]}`, model, i%4, k)
				l.record(l.stream(l.s.steadyKey, body, false))
			}
		}()
	}
	return func() { close(quit) }
}

// startMetered runs one worker for the tokens-per-minute tenant: requests without max_tokens (the engine's own
// default is 600 tokens, above the policy's 32), asking for usage so the tokens served can be summed.
func (l *load) startMetered() {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for k := 0; ; k++ {
			select {
			case <-l.stop:
				return
			default:
			}
			body := fmt.Sprintf(`{"model":"qwen","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"tell me story %d"}]}`, k)
			r := l.stream(l.s.meteredKey, body, true)
			l.record(r)
			if r.outcome == rejected {
				select { // the quota says when to retry; a short pause keeps the worker from spinning
				case <-time.After(50 * time.Millisecond):
				case <-l.stop:
					return
				}
			}
		}
	}()
}

// stream sends one streaming request and classifies how it ended.
func (l *load) stream(key, body string, metered bool) result {
	r := result{start: time.Now(), metered: metered}
	defer l.done(l.begin(r.start))
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, l.s.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		r.outcome, r.detail = lostReq, "no response: "+err.Error()
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		switch {
		case err != nil || len(b) == 0:
			r.outcome, r.detail = lostReq, fmt.Sprintf("%d without a body", resp.StatusCode)
		case metered && resp.StatusCode == http.StatusTooManyRequests:
			r.outcome = rejected
		default:
			r.outcome, r.detail = clearErr, fmt.Sprintf("%d %.400s", resp.StatusCode, b)
		}
		r.end = time.Now()
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			done = true
			continue
		}
		if metered && strings.HasPrefix(line, "data: {") && strings.Contains(line, `"usage"`) {
			var ev struct {
				Usage *struct {
					Prompt     int64 `json:"prompt_tokens"`
					Completion int64 `json:"completion_tokens"`
				} `json:"usage"`
			}
			if json.Unmarshal([]byte(line[6:]), &ev) == nil && ev.Usage != nil {
				r.tokens = ev.Usage.Prompt + ev.Usage.Completion
			}
		}
	}
	switch {
	case sc.Err() != nil:
		r.outcome, r.detail = lostReq, "stream cut: "+sc.Err().Error()
	case !done:
		r.outcome, r.detail = lostReq, "stream ended without [DONE]"
	default:
		r.outcome = ok
	}
	r.end = time.Now()
	return r
}

// close stops every worker and waits for their last requests.
func (l *load) close() {
	close(l.stop)
	l.wg.Wait()
}
