package director

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

func TestGood(t *testing.T) {
	ms := time.Millisecond
	tg := policies.Targets{TTFT: 100 * ms, TPOT: 30 * ms, Objective: 0.99, Set: true}
	stream := func(ttft, tpot time.Duration) Settlement {
		return Settlement{Outcome: OutcomeOK, Stream: true, Targets: tg, Timing: Timing{TTFT: ttft, TPOT: tpot, Chunked: true},
			Usage: openai.Usage{CompletionTokens: 10}}
	}
	whole := func(e2e time.Duration, tokens int64) Settlement {
		return Settlement{Outcome: OutcomeOK, Targets: tg, Timing: Timing{TTFT: e2e, E2E: e2e}, Usage: openai.Usage{CompletionTokens: tokens}}
	}
	cases := []struct {
		name string
		st   Settlement
		want bool
	}{
		{"stream within both", stream(90*ms, 25*ms), true},
		{"stream at the targets", stream(100*ms, 30*ms), true},
		{"stream slow first token", stream(101*ms, 25*ms), false},
		{"stream slow decode", stream(50*ms, 31*ms), false},
		{"failed", Settlement{Outcome: OutcomeUpstream5xx, Targets: tg}, false},
		// non-streaming: 100ms + 9 × 30ms = 370ms for 10 tokens
		{"whole within budget", whole(370*ms, 10), true},
		{"whole over budget", whole(371*ms, 10), false},
		{"whole one token", whole(100*ms, 1), true},
		{"stream seen whole is judged by its budget", Settlement{Outcome: OutcomeOK, Stream: true, Targets: tg,
			Timing: Timing{TTFT: 300 * ms, E2E: 300 * ms}, Usage: openai.Usage{CompletionTokens: 10}}, true},
		{"no slo: success is good", Settlement{Outcome: OutcomeOK, Timing: Timing{E2E: time.Hour}}, true},
		{"huge token count saturates", Settlement{Outcome: OutcomeOK, Targets: tg, Timing: Timing{E2E: time.Hour},
			Usage: openai.Usage{CompletionTokens: 1 << 62}}, true},
	}
	for _, c := range cases {
		if got := good(c.st); got != c.want {
			t.Errorf("%s: good = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOutcomeClasses(t *testing.T) {
	cases := []struct {
		o    Outcome
		want string
	}{
		{Outcome{Status: 200}, OutcomeOK},
		{Outcome{Status: 200, Aborted: true}, OutcomeReset},
		{Outcome{Status: 0, Aborted: true}, OutcomeReset},
		{Outcome{Status: 408}, OutcomeTimeout},
		{Outcome{Status: 504, Aborted: true}, OutcomeTimeout},
		{Outcome{Status: 429}, OutcomeSaturated},
		{Outcome{Status: 503}, OutcomeUpstream5xx},
		{Outcome{Status: 400}, OutcomeClientError},
	}
	for _, c := range cases {
		if got := outcomeOf(c.o); got != c.want {
			t.Errorf("outcomeOf(%+v) = %s, want %s", c.o, got, c.want)
		}
	}
}

// Settle measures from the request's start: TTFT to the first content, TPOT over the tokens after it, and
// judges the request against its tier's SLO.
func TestSettleTimesAndJudges(t *testing.T) {
	snap := quickstart(t)
	d := New(Options{Policies: policies.NewStaticStore(snap)})
	tenant, _ := snap.TenantForKey("sk-demo-acme") // enterprise: qwen 200ms / 30ms
	body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"qwen-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer body.Release()
	t0 := time.Unix(1000, 0)
	rt := &Route{}
	if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body, Started: t0}, rt); err != nil {
		t.Fatal(err)
	}
	st := d.Settle(rt, Outcome{Status: 200, Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 11}, Reported: true, Chunked: true,
		FirstContent: t0.Add(150 * time.Millisecond), LastContent: t0.Add(450 * time.Millisecond), Ended: t0.Add(460 * time.Millisecond),
		MaxGap: 40 * time.Millisecond})
	want := Timing{TTFT: 150 * time.Millisecond, TPOT: 30 * time.Millisecond, MaxITL: 40 * time.Millisecond, E2E: 460 * time.Millisecond, Chunked: true}
	if st.Timing != want {
		t.Errorf("timing %+v, want %+v", st.Timing, want)
	}
	if !st.Good || st.Tier != "enterprise" || st.Targets.TTFT != 200*time.Millisecond || st.Outcome != OutcomeOK {
		t.Errorf("settlement %+v: want good against enterprise's 200ms", st)
	}
	if st.HardwareClass != "l40s" || st.ServedModel != "Qwen/Qwen2.5-7B-Instruct" || !st.Routed {
		t.Errorf("settlement %+v: want the l40s pool and the served name", st)
	}
}

// A refused request reaches the observers with its class, so goodput counts it.
func TestRefusalsReachObservers(t *testing.T) {
	snap := quickstart(t)
	var heard []Settlement
	now := time.Unix(2000, 0)
	d := New(Options{Policies: policies.NewStaticStore(snap), Now: func() time.Time { return now },
		Observers: []SettleObserver{ObserverFunc(func(s Settlement) { heard = append(heard, s) })}})
	tenant, _ := snap.TenantForKey("sk-demo-initech")
	req, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"llama-70b","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &req,
		Started: now.Add(-time.Millisecond)}, &Route{}); err == nil {
		t.Fatal("initech may not use llama-70b")
	}
	if len(heard) != 1 || heard[0].Routed || heard[0].Outcome != OutcomeClientError || heard[0].Tier != "free" ||
		heard[0].Timing.E2E != time.Millisecond {
		t.Errorf("observers heard %+v", heard)
	}
}

// Failed responses are logged at warn with their request id and endpoint, at most a burst per second.
func TestUpstreamWarningsAreRateLimited(t *testing.T) {
	var buf syncBuffer
	now := time.Unix(3000, 0)
	w := &upstreamWarnings{now: func() time.Time { return now }, burst: 2}
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	for i := range 5 {
		w.log(log, Settlement{RequestID: fmt.Sprintf("r%d", i), Outcome: OutcomeUpstream5xx, Endpoint: "10.0.0.1:8000", Status: 503})
	}
	w.log(log, Settlement{RequestID: "fine", Outcome: OutcomeOK})
	now = now.Add(time.Second)
	w.log(log, Settlement{RequestID: "r9", Outcome: OutcomeReset, Endpoint: "10.0.0.2:8000"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{`"request_id":"r0"`, `"endpoint":"10.0.0.1:8000"`, `"level":"WARN"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("first line %s lacks %s", lines[0], want)
		}
	}
	if !strings.Contains(lines[2], `"request_id":"r9"`) || !strings.Contains(lines[2], `"suppressed_since_last":3`) {
		t.Errorf("third line %s: want r9 and 3 suppressed", lines[2])
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A model name the policy does not know is the client's string: observers see a fixed placeholder instead, so
// no client can mint metric series or audit fields.
func TestUnknownModelIsNotReported(t *testing.T) {
	snap := quickstart(t)
	var heard []Settlement
	d := New(Options{Policies: policies.NewStaticStore(snap),
		Observers: []SettleObserver{ObserverFunc(func(s Settlement) { heard = append(heard, s) })}})
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	req, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"made-up-1234","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer req.Release()
	_ = d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &req}, &Route{})
	if len(heard) != 1 || heard[0].Model != UnknownModel || heard[0].Outcome != OutcomeClientError {
		t.Errorf("observers heard %+v", heard)
	}
}

// timingPicker records what Settle teaches the picker about timing (Picker.ObserveTiming).
type timingPicker struct {
	picker.Picker
	heard []time.Duration // ttft, tpot pairs
}

func (p *timingPicker) ObserveTiming(model string, d picker.Decision, ttft, tpot time.Duration) {
	p.heard = append(p.heard, ttft, tpot)
}

// Settle hands the picker the time from routing to the first token and the TPOT of a streamed success, and
// nothing for a response it did not see chunk by chunk.
func TestSettleTeachesThePickerTiming(t *testing.T) {
	snap := quickstart(t)
	tp := &timingPicker{Picker: &picker.LeastInFlight{InFlight: &fleet.InFlight{}}}
	d := New(Options{Policies: policies.NewStaticStore(snap), Picker: tp, InFlight: &fleet.InFlight{}})
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	t0 := time.Unix(1000, 0)
	for _, chunked := range []bool{true, false} {
		body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"qwen-7b","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		rt := &Route{}
		if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body, Started: t0}, rt); err != nil {
			t.Fatal(err)
		}
		d.Settle(rt, Outcome{Status: 200, Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 11}, Reported: true, Chunked: chunked,
			FirstContent: t0.Add(150 * time.Millisecond), LastContent: t0.Add(450 * time.Millisecond), Ended: t0.Add(460 * time.Millisecond)})
		body.Release()
	}
	if want := []time.Duration{150 * time.Millisecond, 30 * time.Millisecond}; !slices.Equal(tp.heard, want) {
		t.Fatalf("the picker heard %v, want %v (the chunked response only)", tp.heard, want)
	}
}
