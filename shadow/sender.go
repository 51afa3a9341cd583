// Package shadow sends copies of baseline requests to a rollout's candidate in its shadow phase and measures
// its answers as the gateway measures a routed request's, for the rollout's gates. A copy is never returned to
// a client and never charged: the sender settles it only with its own observers (the rollout controller, the
// audit log), and it never waits — a copy beyond the phase's bounds is not sent.
package shadow

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/telemetry"
)

// maxAnswer bounds what is read of one copy's answer (the candidate is trusted as much as any engine).
const maxAnswer = 64 << 20

// Options wire a Sender.
type Options struct {
	// Client reaches the candidate's engines (default: plain HTTP, as Envoy reaches them, 5 min a copy).
	Client *http.Client
	// Observers are told each copy's settlement, marked Shadow.
	Observers []director.SettleObserver
	Now       func() time.Time
	Registry  prometheus.Registerer
	// Pairs, when set, is given each copied request's two answers when the rollout judges shadow pairs
	// (director.ShadowCopy.Pair) and both ended well; it must not wait.
	Pairs func(director.ShadowPair)
	// Tracing, when set, gives each copy a span of its own (infergate.shadow true, the baseline request's id),
	// whose context goes to the candidate's engine.
	Tracing *telemetry.Tracing
}

// Sender is director.Shadows.
type Sender struct {
	opts   Options
	copies *prometheus.CounterVec
	next   atomic.Uint64
	mu     sync.Mutex
	models map[string]*bounds
	wg     sync.WaitGroup
	pairs  pairs
}

// bounds are one model's copies in flight and its token bucket of starts.
type bounds struct {
	inflight int
	tokens   float64
	at       time.Time
}

// New builds a Sender.
func New(o Options) *Sender {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 5 * time.Minute}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Sender{opts: o, models: map[string]*bounds{},
		copies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "infergate_shadow_requests_total",
			Help: "Copies of baseline requests for a rollout's candidate in its shadow phase, by result: dropped (a bound was reached), ok, error; and paired: copies whose answer and the baseline's went to the rollout's judge."},
			[]string{"model", "result"})}
	if o.Registry != nil {
		o.Registry.MustRegister(s.copies)
	}
	return s
}

// Send implements director.Shadows.
func (s *Sender) Send(c director.ShadowCopy) bool {
	admitted, inflight := false, 0
	if len(c.Endpoints) > 0 && c.Plan != nil {
		admitted, inflight = s.admit(c)
	}
	if !admitted {
		s.copies.WithLabelValues(c.Model, "dropped").Inc()
		return false
	}
	body := c.Body()
	ep := c.Endpoints[int(s.next.Add(1)%uint64(len(c.Endpoints)))]
	pair := c.Pair && s.pairs.open(c.Model, c.RequestID, body, s.opts.Now())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.release(c.Model)
		st, text := s.run(c, ep, body, pair)
		// The copies are the candidate's only load in this phase, spread evenly over its engines.
		st.Load = int64(inflight / len(c.Endpoints))
		if pair {
			if whole, ok := s.pairs.answer(c.RequestID, 0, st.Outcome == director.OutcomeOK, text); ok {
				s.judge(whole)
			}
		}
		result := "ok"
		if st.Outcome != director.OutcomeOK {
			result = "error"
		}
		s.copies.WithLabelValues(c.Model, result).Inc()
		for _, o := range s.opts.Observers {
			o.Settled(st)
		}
	}()
	return true
}

// Wait waits for the copies in flight (for tests and shutdown).
func (s *Sender) Wait() { s.wg.Wait() }

// admit takes a place for a copy within the phase's bounds: its concurrency and its starts per second (a token
// bucket holding at most a second's worth); it also says how many of the model's copies were in flight before.
func (s *Sender) admit(c director.ShadowCopy) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	b := s.models[c.Model]
	burst := max(1, c.Plan.MaxPerSecond)
	if b == nil {
		b = &bounds{tokens: burst, at: now}
		s.models[c.Model] = b
	}
	b.tokens = min(burst, b.tokens+now.Sub(b.at).Seconds()*c.Plan.MaxPerSecond)
	b.at = now
	if b.inflight >= c.Plan.MaxConcurrent || b.tokens < 1 {
		return false, 0
	}
	b.inflight++
	b.tokens--
	return true, b.inflight - 1
}

func (s *Sender) release(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[model].inflight--
}

// run sends one copy and settles it as the gateway settles a routed request; with keep, it also returns the
// answer's generated text (up to director.MaxPairedAnswer).
func (s *Sender) run(c director.ShadowCopy, ep string, body []byte, keep bool) (director.Settlement, []byte) {
	start := s.opts.Now()
	st := director.Settlement{RequestID: c.RequestID, Routed: true, Model: c.Model, Tier: c.Tier, Arm: picker.ArmCandidate, Shadow: true, Operation: c.Endpoint,
		Stream: c.Stream, HardwareClass: c.HardwareClass, Provider: c.Provider, Endpoint: ep, Started: start, Targets: c.Targets}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+ep+path(c.Endpoint), bytes.NewReader(body))
	if err != nil {
		st.Outcome = director.OutcomeReset
		return st, nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Infergate-Shadow", "1") // the engine's logs can tell a copy from a client's request
	trace := s.opts.Tracing.Begin("", "", "", c.Endpoint, start)
	if tp, ts := trace.Upstream(); tp != "" {
		req.Header.Set("traceparent", tp)
		if ts != "" {
			req.Header.Set("tracestate", ts)
		}
	}
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		st.Outcome = director.OutcomeReset
		if errors.Is(err, context.DeadlineExceeded) {
			st.Outcome = director.OutcomeTimeout
		}
		st.Result, st.TraceID = "upstream_error", trace.TraceID()
		trace.End(st, telemetry.Marks{Routed: start, Ended: s.opts.Now()})
		return st, nil
	}
	defer resp.Body.Close()
	st.Status = resp.StatusCode
	a := answer{keep: keep}
	if c.Stream {
		err = a.readStream(resp.Body, s.opts.Now)
	} else {
		err = a.readJSON(resp.Body)
	}
	end := s.opts.Now()
	switch {
	case resp.StatusCode >= 500:
		st.Outcome = director.OutcomeUpstream5xx
	case resp.StatusCode >= 400:
		st.Outcome = director.OutcomeClientError // the copy's fault as much as the candidate's: the gates leave it out
	case err != nil:
		st.Outcome = director.OutcomeReset
	default:
		st.Outcome = director.OutcomeOK
	}
	st.Usage, st.Reported, st.FinishReason = a.usage, a.reported, a.finish
	st.Timing.E2E = end.Sub(start)
	if !a.first.IsZero() {
		st.Timing.TTFT, st.Timing.Chunked = a.first.Sub(start), true
		if n := a.usage.CompletionTokens; n > 1 {
			st.Timing.TPOT = end.Sub(a.first) / time.Duration(n-1)
		}
	}
	st.Result = "completed"
	if st.Outcome != director.OutcomeOK {
		st.Result = "upstream_error"
	}
	st.Good = director.Good(st)
	st.TraceID = trace.TraceID()
	trace.End(st, telemetry.Marks{Routed: start, FirstToken: a.first, Ended: end})
	return st, a.text
}

func path(e openai.Endpoint) string {
	switch e {
	case openai.EndpointCompletions:
		return openai.PathCompletions
	case openai.EndpointEmbeddings:
		return openai.PathEmbeddings
	case openai.EndpointResponses:
		return openai.PathResponses
	}
	return openai.PathChat
}

// answer is what a copy's response told: its usage, its finish reason and when its first content came (zero
// unless streamed).
type answer struct {
	usage    openai.Usage
	reported bool
	finish   string
	first    time.Time
	// keep says to keep the generated text, up to director.MaxPairedAnswer.
	keep bool
	text []byte
}

// Write keeps generated text, bounded (openai.OutputText writes here).
func (a *answer) Write(p []byte) (int, error) {
	if room := director.MaxPairedAnswer - len(a.text); room > 0 {
		a.text = append(a.text, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// chunk is the part of a response (or a stream's chunk) the settlement reads.
type chunk struct {
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
}

func (c chunk) content() bool {
	for _, ch := range c.Choices {
		if ch.Delta.Content != "" || ch.Text != "" {
			return true
		}
	}
	return false
}

// take keeps a chunk's usage; a negative count (from a broken engine) reads as 0.
func (a *answer) take(c chunk) {
	if c.Usage != nil {
		a.usage, a.reported = openai.Usage{PromptTokens: max(0, c.Usage.PromptTokens), CompletionTokens: max(0, c.Usage.CompletionTokens)}, true
	}
}

// readStream reads a server-sent event stream to its end: the first chunk with content, the usage, the finish
// reason and, when kept, the text.
func (a *answer) readStream(r io.Reader, now func() time.Time) error {
	sc := bufio.NewScanner(io.LimitReader(r, maxAnswer))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, []byte("[DONE]")) {
			return nil
		}
		var c chunk
		if json.Unmarshal(data, &c) != nil {
			continue
		}
		if a.first.IsZero() && c.content() {
			a.first = now()
		}
		if a.finish == "" {
			a.finish = openai.FinishReason(data)
		}
		if a.keep {
			for _, ch := range c.Choices {
				_, _ = io.WriteString(a, ch.Delta.Content)
				_, _ = io.WriteString(a, ch.Text)
			}
		}
		a.take(c)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF // no [DONE]: the stream was cut
}

// readJSON reads a whole answer: its usage, finish reason and, when kept, text.
func (a *answer) readJSON(r io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(r, maxAnswer))
	if err != nil {
		return err
	}
	var c chunk
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	a.take(c)
	a.finish = openai.FinishReason(b)
	if a.keep {
		openai.OutputText(b, a)
	}
	return nil
}
