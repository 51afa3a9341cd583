package shadow

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
)

// heard collects the settlements a Sender tells its observers.
type heard struct {
	mu  sync.Mutex
	all []director.Settlement
}

func (h *heard) Settled(st director.Settlement) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, st)
}

// engine answers a streamed chat completion with three content chunks and the usage, or with status when set;
// gate, when set, holds every answer until it is closed.
func engine(t *testing.T, status int, gate chan struct{}) (string, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.URL.Path+" "+r.Header.Get("X-Infergate-Shadow")+" "+string(b))
		mu.Unlock()
		if gate != nil {
			<-gate
		}
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range []string{"Hel", "lo", "!"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", c)
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), &bodies
}

func copyFor(ep string, plan *policies.ShadowPlan) director.ShadowCopy {
	return director.ShadowCopy{Model: "m", Tier: "pro", Plan: plan, Endpoint: openai.EndpointChat, Stream: true,
		Body: func() []byte { return []byte(`{"model":"m-next","stream":true}`) }, Endpoints: []string{ep}, HardwareClass: "h100",
		Provider: "vllm", Targets: policies.Targets{TTFT: time.Minute, TPOT: time.Minute, Set: true}}
}

// A copy is sent to the candidate's engine as built, marked, and settled for the observers alone as a
// candidate-arm, shadow request with the latency and usage measured from its stream.
func TestACopyIsMeasuredAndSettledAsShadow(t *testing.T) {
	ep, bodies := engine(t, 0, nil)
	h := &heard{}
	reg := prometheus.NewRegistry()
	s := New(Options{Observers: []director.SettleObserver{h}, Registry: reg})
	if !s.Send(copyFor(ep, &policies.ShadowPlan{MaxConcurrent: 4, MaxPerSecond: 10})) {
		t.Fatal("the copy was not sent")
	}
	s.Wait()
	if len(*bodies) != 1 || (*bodies)[0] != `/v1/chat/completions 1 {"model":"m-next","stream":true}` {
		t.Fatalf("the engine saw %q", *bodies)
	}
	if len(h.all) != 1 {
		t.Fatalf("%d settlements", len(h.all))
	}
	st := h.all[0]
	if !st.Shadow || st.Arm != picker.ArmCandidate || st.Tenant != "" || st.Outcome != director.OutcomeOK || !st.Good ||
		st.Usage.CompletionTokens != 3 || !st.Reported || st.Timing.TTFT <= 0 || !st.Timing.Chunked || st.Provider != "vllm" {
		t.Errorf("settlement %+v", st)
	}
	if n := testutil.ToFloat64(s.copies.WithLabelValues("m", "ok")); n != 1 {
		t.Errorf("ok copies %v", n)
	}
}

// The sender never waits: past the phase's concurrency or its starts per second a copy is dropped at once
// and counted, so the client whose request is copied is never delayed by a slow candidate.
func TestCopiesStayWithinTheirBounds(t *testing.T) {
	gate := make(chan struct{})
	ep, _ := engine(t, 0, gate)
	clock := fakeclock.New()
	h := &heard{}
	s := New(Options{Observers: []director.SettleObserver{h}, Now: clock.Now})
	plan := &policies.ShadowPlan{MaxConcurrent: 2, MaxPerSecond: 3}
	var sent int
	for range 5 {
		if s.Send(copyFor(ep, plan)) {
			sent++
		}
	}
	if sent != 2 {
		t.Errorf("%d copies in flight, want the 2 the phase allows", sent)
	}
	close(gate)
	s.Wait()
	// The two copies at once: the second was sent with the first in flight at the candidate's one engine.
	if loads := []int64{h.all[0].Load, h.all[1].Load}; slices.Min(loads) != 0 || slices.Max(loads) != 1 {
		t.Errorf("the copies' loads %v, want 0 and 1", loads)
	}
	// One start left in the second's bucket of three; a second later there are three again.
	if !s.Send(copyFor(ep, plan)) || s.Send(copyFor(ep, plan)) {
		t.Error("the bucket's last start, then none")
	}
	s.Wait()
	clock.Advance(time.Second)
	for i := range 2 {
		if !s.Send(copyFor(ep, plan)) {
			t.Errorf("start %d of the next second refused", i)
		}
	}
	s.Wait()
	if !s.Send(copyFor(ep, plan)) || s.Send(copyFor(ep, plan)) {
		t.Error("the next second's third start, then none")
	}
	s.Wait()
	if n := testutil.ToFloat64(s.copies.WithLabelValues("m", "dropped")); n != 5 {
		t.Errorf("dropped %v, want 5", n)
	}
	if len(h.all) != 6 {
		t.Errorf("%d copies settled, want 6", len(h.all))
	}
}

// A candidate that fails the copy is settled as the gateway classes a failed upstream.
func TestAFailedCopy(t *testing.T) {
	for _, tc := range []struct {
		status  int
		outcome string
	}{{500, director.OutcomeUpstream5xx}, {400, director.OutcomeClientError}} {
		ep, _ := engine(t, tc.status, nil)
		h := &heard{}
		s := New(Options{Observers: []director.SettleObserver{h}})
		s.Send(copyFor(ep, &policies.ShadowPlan{MaxConcurrent: 1, MaxPerSecond: 1}))
		s.Wait()
		if len(h.all) != 1 || h.all[0].Outcome != tc.outcome || h.all[0].Good || h.all[0].Status != tc.status {
			t.Errorf("%d: %+v", tc.status, h.all)
		}
	}
	h := &heard{}
	s := New(Options{Observers: []director.SettleObserver{h}})
	s.Send(copyFor("127.0.0.1:1", &policies.ShadowPlan{MaxConcurrent: 1, MaxPerSecond: 1})) // nothing listens
	s.Wait()
	if len(h.all) != 1 || h.all[0].Outcome != director.OutcomeReset {
		t.Errorf("unreachable: %+v", h.all)
	}
}
