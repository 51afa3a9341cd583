package rollout

import (
	"context"
	"encoding/json"
	"fmt"

	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
	"github.com/infergate/infergate/test/wait"
)

// chatEngine serves model m: its /v1/models, and chat completions answered by answer(last user message). It
// counts the completions it answered.
type chatEngine struct {
	addr    string
	answers atomic.Int64
}

func newChatEngine(t *testing.T, status int, answer func(prompt string) string) *chatEngine {
	t.Helper()
	e := &chatEngine{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case "/v1/chat/completions":
			var req struct {
				Model       string  `json:"model"`
				Temperature float64 `json:"temperature"`
				Messages    []struct {
					Content string `json:"content"`
				} `json:"messages"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model != "m" || len(req.Messages) == 0 || req.Temperature != 0 {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			e.answers.Add(1)
			if status != http.StatusOK {
				http.Error(w, `{"error":{"message":"overloaded"}}`, status)
				return
			}
			text, _ := json.Marshal(answer(req.Messages[len(req.Messages)-1].Content))
			fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]}`, text)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	e.addr = strings.TrimPrefix(srv.URL, "http://")
	return e
}

// knows answers the golden set's questions right, except those listed.
func knows(wrong ...string) func(string) string {
	return func(prompt string) string {
		for _, w := range wrong {
			if strings.Contains(prompt, w) {
				return "I am not sure."
			}
		}
		switch {
		case strings.Contains(prompt, "capital"):
			return " Paris\n"
		case strings.Contains(prompt, "digits"):
			return "It is 4096."
		case strings.Contains(prompt, "JSON"):
			return `{"city": "Paris", "population": 2100000}`
		}
		return "hello"
	}
}

// goldenSet is an eval gate with one case of each local check (the webhook is tested on its own).
const goldenSet = `      eval:
        margin: 0.1
        timeout: 5s
        cases:
        - {name: capital, messages: [{role: user, content: "The capital of France, one word?"}], exact: Paris}
        - {name: digits, messages: [{role: user, content: "Two to the twelfth, in digits?"}], regex: '\b4096\b'}
        - name: json
          messages: [{role: user, content: "Paris as JSON with city and population."}]
          jsonSchema: {type: object, required: [city, population], properties: {population: {type: integer}}}
`

// newEvalFixture is a rollout of model m from pool v1 to v2 with the given eval gate, on two chat engines.
func newEvalFixture(t *testing.T, store Store, eval string, base, cand *chatEngine) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: fakeclock.New(), store: store, path: filepath.Join(t.TempDir(), "policy.yaml")}
	f.write(fmt.Sprintf(controllerPolicy, base.addr, cand.addr, "", eval))
	pols, err := policies.NewStore(f.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.pols = pols
	return f
}

// tickUntil ticks c until its rollout leaves phase from.
func tickUntil(t *testing.T, f *fixture, c *Controller, from Phase) Status {
	t.Helper()
	var s Status
	wait.Within(t, "the rollout leaving "+string(from), 30*time.Second, func() bool {
		c.Tick(context.Background())
		s = f.status(c)
		return s.Phase != from
	})
	return s
}

// The eval gate runs the golden set against both arms after the compatibility gate and before any traffic: a
// candidate as good as the baseline (an A/A run: the same answers) goes on to its first step, one that answers
// worse beyond the margin is rolled back with the cases it regressed on, and no client request reached it.
func TestEvalGateDecidesBeforeAnyTraffic(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cand   func(string) string
		want   Phase
		reason string
	}{
		{"the same answers", knows(), Progressing, "the eval gate passed: candidate passed 100.0% of 3 cases, the baseline 100.0%"},
		{"one wrong answer", knows("capital"), RolledBack, "eval gate: candidate passed 66.7% of 3 cases, the baseline 100.0% (margin 10.0 points); worse on capital"},
		{"invalid JSON", func(p string) string { return strings.TrimSuffix(knows()(p), "}") }, RolledBack, "worse on json"},
		{"a wrong type", func(p string) string { return strings.ReplaceAll(knows()(p), "2100000", `"many"`) }, RolledBack, "worse on json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, cand := newChatEngine(t, http.StatusOK, knows()), newChatEngine(t, http.StatusOK, tc.cand)
			f := newEvalFixture(t, NewMemoryStore(), goldenSet, base, cand)
			c := f.controller(nil)
			c.Tick(context.Background())
			if s := f.status(c); s.Phase != Evaluating || c.Share("m") != 0 {
				t.Fatalf("after the compatibility gate: %+v share %v", s, c.Share("m"))
			}
			var shares []float64
			c.OnShareChange(func() { shares = append(shares, c.Share("m")) })
			s := tickUntil(t, f, c, Evaluating)
			if s.Phase != tc.want || !strings.Contains(s.Reason, tc.reason) {
				t.Fatalf("%s: %q, want %s: %q", s.Phase, s.Reason, tc.want, tc.reason)
			}
			if base.answers.Load() != 3 || cand.answers.Load() != 3 || s.Eval == nil || s.Eval.Cases != 3 {
				t.Errorf("answers asked: baseline %d, candidate %d; report %+v", base.answers.Load(), cand.answers.Load(), s.Eval)
			}
			if tc.want == RolledBack && (len(shares) > 0 || c.Share("m") != 0) {
				t.Errorf("the candidate took traffic: shares %v", shares)
			}
			if tc.want == Progressing && c.Share("m") != 0.05 {
				t.Errorf("share %v after the eval gate passed", c.Share("m"))
			}
		})
	}
}

// A candidate whose engine errs fails each case it errs on; a baseline that errs says nothing of the candidate:
// the run is inconclusive, the rollout stays evaluating and the gate runs again after a minute.
func TestEvalGateErrors(t *testing.T) {
	t.Run("candidate errs", func(t *testing.T) {
		base, cand := newChatEngine(t, http.StatusOK, knows()), newChatEngine(t, http.StatusServiceUnavailable, knows())
		f := newEvalFixture(t, NewMemoryStore(), goldenSet, base, cand)
		c := f.controller(nil)
		c.Tick(context.Background())
		s := tickUntil(t, f, c, Evaluating)
		if s.Phase != RolledBack || !strings.Contains(s.Reason, "3 candidate answers were errors") {
			t.Fatalf("%s: %q", s.Phase, s.Reason)
		}
	})
	t.Run("baseline errs", func(t *testing.T) {
		base, cand := newChatEngine(t, http.StatusServiceUnavailable, knows()), newChatEngine(t, http.StatusOK, knows())
		f := newEvalFixture(t, NewMemoryStore(), goldenSet, base, cand)
		c := f.controller(nil)
		c.Tick(context.Background())
		var s Status
		wait.Within(t, "an inconclusive run", 30*time.Second, func() bool {
			c.Tick(context.Background())
			s = f.status(c)
			return strings.Contains(s.Reason, "inconclusive")
		})
		if s.Phase != Evaluating || s.EvalBy != "" || !strings.Contains(s.Reason, "answered 503; it runs again in 1m0s") {
			t.Fatalf("%+v", s)
		}
		asked := base.answers.Load()
		c.Tick(context.Background())
		f.clock.Advance(59 * time.Second)
		c.Tick(context.Background())
		if base.answers.Load() != asked || f.status(c).EvalBy != "" {
			t.Fatalf("the gate ran again within the minute")
		}
		f.clock.Advance(time.Second)
		c.Tick(context.Background())
		if s := f.status(c); s.EvalBy == "" {
			t.Fatalf("the gate did not run again after a minute: %+v", s)
		}
	})
}

// A webhook scores each pair of answers; the pass rates are the means of its scores. A webhook that answers
// nonsense makes the run inconclusive rather than deciding anything.
func TestEvalGateWebhookScoresPairs(t *testing.T) {
	var asked atomic.Int64
	var bad atomic.Bool
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ask webhookAsk
		if err := json.NewDecoder(r.Body).Decode(&ask); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		asked.Add(1)
		if bad.Load() {
			fmt.Fprint(w, `{"baseline": 1.5, "candidate": 0}`)
			return
		}
		// A judge: a full mark for the longer answer, a half for the other.
		b, c := 0.5, 0.5
		if len(ask.Baseline) >= len(ask.Candidate) {
			b = 1
		} else {
			c = 1
		}
		fmt.Fprintf(w, `{"baseline": %v, "candidate": %v}`, b, c)
	}))
	t.Cleanup(hook.Close)
	eval := fmt.Sprintf(`      eval:
        margin: 0.2
        cases:
        - {name: a, messages: [{role: user, content: "Say something."}], webhook: %q}
        - {name: b, messages: [{role: user, content: "Say something else."}], webhook: %q}
`, hook.URL, hook.URL)
	base := newChatEngine(t, http.StatusOK, func(string) string { return "a long and careful answer" })
	cand := newChatEngine(t, http.StatusOK, func(string) string { return "short" })
	f := newEvalFixture(t, NewMemoryStore(), eval, base, cand)
	c := f.controller(nil)
	c.Tick(context.Background())
	s := tickUntil(t, f, c, Evaluating)
	if s.Phase != RolledBack || s.Eval == nil || s.Eval.Candidate != 0.5 || s.Eval.Baseline != 1 || asked.Load() != 2 {
		t.Fatalf("%s %q %+v, webhook asked %d times", s.Phase, s.Reason, s.Eval, asked.Load())
	}
	bad.Store(true)
	if _, err := c.Command(context.Background(), "m", Resume); err != nil {
		t.Fatal(err)
	}
	c.Tick(context.Background()) // the compatibility gate
	wait.Within(t, "an inconclusive run", 30*time.Second, func() bool {
		c.Tick(context.Background())
		return strings.Contains(f.status(c).Reason, "not between 0 and 1")
	})
	if s := f.status(c); s.Phase != Evaluating {
		t.Fatalf("%+v", s)
	}
}

// Replicas share the gate: one claims the lease and runs the golden set, the others wait for its verdict; a
// lease whose holder died lapses and another replica runs the gate.
func TestEvalGateRunsOnceAcrossReplicas(t *testing.T) {
	base, cand := newChatEngine(t, http.StatusOK, knows()), newChatEngine(t, http.StatusOK, knows())
	store := NewMemoryStore()
	f := newEvalFixture(t, store, goldenSet, base, cand)
	a, b := f.controller(nil), f.controller(nil)
	a.Tick(context.Background()) // checking → evaluating
	a.Tick(context.Background()) // a claims the lease
	b.Tick(context.Background()) // b reads it and waits
	if sa, sb := f.status(a), f.status(b); sa.EvalBy != a.id || sb.EvalBy != a.id {
		t.Fatalf("lease held by %q and %q, want %q", sa.EvalBy, sb.EvalBy, a.id)
	}
	s := tickUntil(t, f, a, Evaluating)
	b.Tick(context.Background())
	if s.Phase != Progressing || f.status(b).Phase != Progressing || base.answers.Load() != 3 || cand.answers.Load() != 3 {
		t.Fatalf("a: %+v, b: %+v; answers %d and %d", s, f.status(b), base.answers.Load(), cand.answers.Load())
	}

	// Another run, whose first holder dies: b waits out the lease, then takes it.
	if _, err := b.Command(context.Background(), "m", Abort); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Command(context.Background(), "m", Resume); err != nil {
		t.Fatal(err)
	}
	dead := f.controller(nil)
	dead.Tick(context.Background()) // checking → evaluating
	dead.Tick(context.Background()) // claims
	dead.evals.drop("m")            // and dies
	lease := f.status(dead).EvalUntil
	b.Tick(context.Background())
	if s := f.status(b); s.EvalBy != dead.id {
		t.Fatalf("b took a live lease: %+v", s)
	}
	f.clock.Advance(lease.Sub(f.clock.Now()) + time.Second)
	if s := tickUntil(t, f, b, Evaluating); s.Phase != Progressing {
		t.Fatalf("after the lapsed lease: %+v", s)
	}
}

func TestParseWebhookScores(t *testing.T) {
	for _, tc := range []struct {
		in         string
		base, cand float64
		err        string
	}{
		{`{"baseline": 1, "candidate": 0.25}`, 1, 0.25, ""},
		{`{"baseline": 0, "candidate": 0, "why": "both wrong"}`, 0, 0, ""},
		{`{"baseline": 1}`, 0, 0, "are required"},
		{`{"baseline": -0.1, "candidate": 0}`, 0, 0, "not between 0 and 1"},
		{`{"baseline": 1, "candidate": 1e400}`, 0, 0, "webhook answer"},
		{`[1, 1]`, 0, 0, "webhook answer"},
		{strings.Repeat(" ", maxWebhookBody+1), 0, 0, "over"},
	} {
		b, c, err := parseWebhookScores([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%.40q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || b != tc.base || c != tc.cand {
			t.Errorf("%q: %v %v %v", tc.in, b, c, err)
		}
	}
}

func FuzzParseWebhookScores(f *testing.F) {
	for _, s := range []string{`{"baseline": 1, "candidate": 0.5}`, `{"baseline": null, "candidate": 1}`, `{}`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		base, cand, err := parseWebhookScores(b)
		if err == nil && (base < 0 || base > 1 || cand < 0 || cand > 1) {
			t.Fatalf("scores %v %v accepted", base, cand)
		}
	})
}

// The lease covers every case's answers and webhook at the policy's timeout, concurrency cases at a time.
func TestEvalLease(t *testing.T) {
	e := &policies.EvalPlan{Cases: make([]policies.EvalCasePlan, 9), Concurrency: 4, Timeout: 10 * time.Second}
	if got := evalLease(e); got != 3*3*10*time.Second+time.Minute {
		t.Fatalf("lease %v", got)
	}
}

// With shadowPairs, the shadow phase also needs the judge's verdict on pairs of real answers: it holds until
// minPairs pairs are judged, then goes on when the candidate scores within the margin of the baseline, and is
// rolled back when it does not.
func TestShadowPairsJudgeTheShadowPhase(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cand     float64
		want     Phase
		inReason string
	}{{"as good", 0.9, Progressing, ""}, {"worse", 0.5, RolledBack, "shadow pairs: the judge scored the candidate 0.500 against the baseline's 0.900 over 10 pairs"}} {
		t.Run(tc.name, func(t *testing.T) {
			var asked atomic.Int64
			hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var ask webhookAsk
				if err := json.NewDecoder(r.Body).Decode(&ask); err != nil || ask.Case != "shadow" || ask.Baseline != "base says" ||
					ask.Candidate != "cand says" || !strings.Contains(string(ask.Request), `"messages"`) {
					http.Error(w, "bad ask", http.StatusBadRequest)
					return
				}
				asked.Add(1)
				fmt.Fprintf(w, `{"baseline": 0.9, "candidate": %v}`, tc.cand)
			}))
			t.Cleanup(hook.Close)
			f := newFixture(t, NewMemoryStore(), fmt.Sprintf(`      shadow: {percent: 20, minDuration: 1m, minRequests: 30}
      eval: {margin: 0.1, shadowPairs: {webhook: %q, minPairs: 10, maxConcurrent: 2}}`, hook.URL), "m")
			c := f.controller(nil)
			ctx := context.Background()
			c.Tick(ctx)
			if s := f.status(c); s.Phase != Shadowing {
				t.Fatalf("no evaluating phase without cases, straight to shadowing: %+v", s)
			}
			f.clock.Advance(50 * time.Second)
			for range 40 {
				c.Settled(settle(picker.ArmBaseline, true, "ok", 200*time.Millisecond))
				cp := settle(picker.ArmCandidate, true, "ok", 200*time.Millisecond)
				cp.Shadow = true
				c.Settled(cp)
			}
			f.clock.Advance(11 * time.Second)
			c.Tick(ctx)
			if s := f.status(c); s.Phase != Shadowing || !strings.Contains(s.Gates.Reason, "need 10 judged shadow pairs, have 0") {
				t.Fatalf("without pairs: %+v gates %+v", s, s.Gates)
			}
			pair := director.ShadowPair{Model: "m", RequestID: "r", Request: []byte(`{"messages":[]}`), Baseline: []byte("base says"),
				Candidate: []byte("cand says")}
			for asked.Load() < 10 {
				c.ShadowPair(pair) // two at a time at most: the rest are dropped, and sent again here
				wait.For(t, "the judge's answers", func() bool { return c.pairs.read("m").inflight == 0 })
			}
			c.Tick(ctx)
			s := f.status(c)
			if s.Phase != tc.want || !strings.Contains(s.Reason, tc.inReason) {
				t.Fatalf("%s: %q, want %s", s.Phase, s.Reason, tc.want)
			}
		})
	}
}
