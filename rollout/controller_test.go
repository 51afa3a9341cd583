package rollout

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/fakeclock"
	"github.com/infergate/infergate/test/redistest"
)

// engine answers /v1/models with the given ids.
func engine(t *testing.T, ids ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		var data []string
		for _, id := range ids {
			data = append(data, fmt.Sprintf(`{"id":%q,"object":"model"}`, id))
		}
		fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(data, ","))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

const controllerPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h100: {costPerHour: 2, prefillTokensPerSecond: 10000, decodeTokensPerSecond: 2000}
  models:
  - name: m
    pools:
    - {name: v1, hardwareClass: h100, engine: vllm, endpoints: ["%s"]}
    - {name: v2, hardwareClass: h100, engine: vllm, endpoints: ["%s"]%s}
    rollout:
      candidate: {pool: v2}
      steps: [{percent: 5, minDuration: 1m, minRequests: 30}, {percent: 50, minDuration: 1m, minRequests: 30}, {percent: 100, minDuration: 1m, minRequests: 30}]
      gates: {minRequests: 20, warmup: 30s}
%s
  tenants:
  - {name: t, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

type fixture struct {
	t       *testing.T
	clock   *fakeclock.Clock
	store   Store
	pols    *policies.Store
	path    string
	changes int
}

// newFixture writes a policy whose candidate pool v2 is served by an engine listing candidateIDs.
func newFixture(t *testing.T, store Store, extra string, candidateIDs ...string) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: fakeclock.New(), store: store, path: filepath.Join(t.TempDir(), "policy.yaml")}
	f.write(fmt.Sprintf(controllerPolicy, engine(t, "m"), engine(t, candidateIDs...), "", extra))
	pols, err := policies.NewStore(f.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.pols = pols
	return f
}

func (f *fixture) write(policy string) {
	if err := os.WriteFile(f.path, []byte(policy), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// controller is one gateway replica's controller over the fixture's policy and store.
func (f *fixture) controller(engines EngineView) *Controller {
	c := New(Options{Policies: f.pols, Store: f.store, Engines: engines, Now: f.clock.Now})
	c.OnShareChange(func() { f.changes++ })
	return c
}

// feed settles n requests on each arm within the current second.
func feed(c *Controller, n int, candTTFT, baseTTFT time.Duration, candOutcome string) {
	for range n {
		c.Settled(settle(picker.ArmBaseline, true, "ok", baseTTFT))
		c.Settled(settle(picker.ArmCandidate, candOutcome == "ok", candOutcome, candTTFT))
	}
}

// The candidate's first requests, on a cold KV cache, are not judged: those started within the warm-up stay
// out of the windows.
func TestWarmupRequestsAreNotJudged(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	c.Tick(context.Background()) // the warm-up's start reaches the windows
	start := f.clock.Now()
	f.clock.Advance(20 * time.Second)
	for range 40 { // slow, but within the warm-up (30 s)
		st := settle(picker.ArmCandidate, true, "ok", 900*time.Millisecond)
		st.Started = start.Add(5 * time.Second)
		c.Settled(st)
		b := settle(picker.ArmBaseline, true, "ok", 200*time.Millisecond)
		b.Started = st.Started
		c.Settled(b)
	}
	c.Tick(context.Background())
	if s := f.status(c); s.Phase != Progressing || s.Gates == nil || s.Gates.Result != "insufficient" {
		t.Fatalf("warm-up requests judged: %+v gates %+v", s, s.Gates)
	}
}

func (f *fixture) status(c *Controller) Status {
	f.t.Helper()
	for _, s := range c.Statuses() {
		if s.Model == "m" {
			return s
		}
	}
	f.t.Fatal("no status for m")
	return Status{}
}

// passStep feeds a healthy minute and ticks.
func (f *fixture) passStep(cs ...*Controller) {
	f.clock.Advance(50 * time.Second)
	for _, c := range cs {
		feed(c, 40, 200*time.Millisecond, 200*time.Millisecond, "ok")
	}
	f.clock.Advance(11 * time.Second)
	for _, c := range cs {
		c.Tick(context.Background())
	}
}

func TestHealthyCandidateReachesEveryStep(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	if c.Share("m") != 0 {
		t.Fatal("a share before the first tick")
	}
	c.Tick(context.Background())
	if s := f.status(c); s.Phase != Progressing || s.Step != 0 || c.Share("m") != 0.05 || f.changes != 1 {
		t.Fatalf("after the compatibility gate: %+v share %v changes %d", s, c.Share("m"), f.changes)
	}
	for step, share := range []float64{0.5, 1} {
		f.passStep(c)
		if s := f.status(c); s.Phase != Progressing || s.Step != step+1 || c.Share("m") != share {
			t.Fatalf("step %d: %+v share %v", step+1, s, c.Share("m"))
		}
	}
	f.passStep(c)
	if s := f.status(c); s.Phase != Promoted || c.Share("m") != 1 {
		t.Fatalf("after the last step: %+v", s)
	}
}

func TestFailedGateRollsBackAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ttft    time.Duration
		outcome string
		reason  string
	}{
		{"slow first tokens", 600 * time.Millisecond, "ok", "TTFT ×3.00"},
		{"errors", 200 * time.Millisecond, "upstream_5xx", "error rate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, NewMemoryStore(), "", "m")
			c := f.controller(nil)
			c.Tick(context.Background())
			f.passStep(c) // at 50 %
			// The next second's requests are bad; the tick after it rolls back, not waiting for the step's
			// minimum duration or requests.
			f.clock.Advance(time.Second)
			feed(c, 25, tc.ttft, 200*time.Millisecond, tc.outcome)
			f.clock.Advance(time.Second)
			c.Tick(context.Background())
			s := f.status(c)
			if s.Phase != RolledBack || c.Share("m") != 0 || !strings.Contains(s.Reason, tc.reason) {
				t.Fatalf("%+v share %v", s, c.Share("m"))
			}
			// A rolled-back rollout stays there: good figures do not bring the candidate back by themselves.
			f.passStep(c)
			if s := f.status(c); s.Phase != RolledBack || c.Share("m") != 0 {
				t.Fatalf("rolled back, then %+v", s)
			}
		})
	}
}

func TestInsufficientDataHoldsTheStep(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	f.clock.Advance(2 * time.Minute)
	feed(c, 10, 200*time.Millisecond, 200*time.Millisecond, "ok") // 10 a side: below the gates' 20
	c.Tick(context.Background())
	s := f.status(c)
	if s.Phase != Progressing || s.Step != 0 || s.Gates == nil || s.Gates.Result != "insufficient" {
		t.Fatalf("%+v gates %+v", s, s.Gates)
	}
}

// fakeEngines reports every endpoint fresh with one version.
type fakeEngines struct{ version string }

func (e fakeEngines) Metrics(string) (fleet.EngineMetrics, bool) {
	return fleet.EngineMetrics{Version: e.version}, e.version != "stale"
}

func TestCompatibilityGateHoldsTheCandidateBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ids     []string
		extra   string
		engines EngineView
		want    string
	}{
		{"model missing", []string{"other"}, "", nil, `does not serve "m"`},
		{"stale metrics", []string{"m"}, "", fakeEngines{"stale"}, "no fresh metrics"},
		{"wrong version", []string{"m"}, "      compatibility: {engineVersion: 0.11.0}", fakeEngines{"0.10.1"}, `reports engine version "0.10.1", want "0.11.0"`},
		{"right version", []string{"m"}, "      compatibility: {engineVersion: 0.11.0}", fakeEngines{"0.11.0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, NewMemoryStore(), tc.extra, tc.ids...)
			c := f.controller(tc.engines)
			c.Tick(context.Background())
			s := f.status(c)
			if tc.want == "" {
				if s.Phase != Progressing {
					t.Fatalf("%+v", s)
				}
				return
			}
			if s.Phase != Checking || c.Share("m") != 0 || !strings.Contains(s.Reason, tc.want) {
				t.Fatalf("%+v share %v, want checking with %q", s, c.Share("m"), tc.want)
			}
		})
	}
}

func TestOperatorCommands(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	ctx := context.Background()
	c.Tick(ctx)
	f.passStep(c) // 50 %
	if _, err := c.Command(ctx, "m", Resume); err != ErrNotApplicable {
		t.Fatalf("resuming a progressing rollout: %v", err)
	}
	if _, err := c.Command(ctx, "nope", Pause); err != ErrNoRollout {
		t.Fatalf("a model without a rollout: %v", err)
	}
	if s, err := c.Command(ctx, "m", Pause); err != nil || s.Phase != Paused || c.Share("m") != 0.5 {
		t.Fatalf("pause: %+v %v", s, err)
	}
	f.passStep(c)
	if s := f.status(c); s.Phase != Paused || s.Step != 1 {
		t.Fatalf("a paused rollout moved: %+v", s)
	}
	before := f.changes
	// An abort sends everything back to the baseline at once, without waiting for a tick.
	if s, err := c.Command(ctx, "m", Abort); err != nil || s.Phase != Aborted || c.Share("m") != 0 || f.changes != before+1 {
		t.Fatalf("abort: %+v %v share %v", s, err, c.Share("m"))
	}
	if s, err := c.Command(ctx, "m", Resume); err != nil || s.Phase != Checking || c.Share("m") != 0 {
		t.Fatalf("resume after an abort starts over from the compatibility gate: %+v %v", s, err)
	}
	c.Tick(ctx)
	if s := f.status(c); s.Phase != Progressing || s.Step != 0 || c.Share("m") != 0.05 {
		t.Fatalf("after the compatibility gate again: %+v", s)
	}
	if s, err := c.Command(ctx, "m", Promote); err != nil || s.Phase != Promoted || c.Share("m") != 1 {
		t.Fatalf("promote: %+v %v", s, err)
	}
}

// Two replicas share one store: they agree on the step, one of them moves it, and a restarted replica resumes
// where the rollout was.
func testSharedState(t *testing.T, store Store) {
	f := newFixture(t, store, "", "m")
	a, b := f.controller(nil), f.controller(nil)
	ctx := context.Background()
	a.Tick(ctx)
	b.Tick(ctx)
	if a.Share("m") != 0.05 || b.Share("m") != 0.05 {
		t.Fatalf("shares %v and %v", a.Share("m"), b.Share("m"))
	}
	// The arms' secret seed is drawn once and shared: both replicas put a conversation in the same arm.
	seed := a.ArmSeed("m")
	if seed == 0 || b.ArmSeed("m") != seed {
		t.Fatalf("arm seeds %x and %x", seed, b.ArmSeed("m"))
	}
	f.passStep(a, b)
	b.Tick(ctx) // b reads what a (or b) moved
	if sa, sb := f.status(a), f.status(b); sa.Step != 1 || sb.Step != 1 || a.Share("m") != b.Share("m") {
		t.Fatalf("the replicas disagree: %+v and %+v", sa, sb)
	}
	// Only b sees the candidate fail: both roll back.
	f.clock.Advance(time.Second)
	feed(b, 25, 900*time.Millisecond, 200*time.Millisecond, "ok")
	f.clock.Advance(time.Second)
	b.Tick(ctx)
	a.Tick(ctx)
	if a.Share("m") != 0 || f.status(a).Phase != RolledBack {
		t.Fatalf("a did not follow b's rollback: %+v", f.status(a))
	}
	if _, err := a.Command(ctx, "m", Resume); err != nil {
		t.Fatal(err)
	}
	a.Tick(ctx) // the compatibility gate
	f.passStep(a)
	// A new process over the same store resumes step 2 instead of starting over.
	restarted := f.controller(nil)
	restarted.Tick(ctx)
	if s := f.status(restarted); s.Phase != Progressing || s.Step != 1 || restarted.Share("m") != 0.5 || restarted.ArmSeed("m") != seed {
		t.Fatalf("after a restart: %+v, seed %x (was %x)", s, restarted.ArmSeed("m"), seed)
	}
}

// A state saved before arms were keyed gets a seed, saved for every replica.
func TestAStateWithoutASeedGetsOne(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	ctx := context.Background()
	c.Tick(ctx)
	raw, err := f.store.Load(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	st.ArmSeed = 0
	old, _ := json.Marshal(st)
	if ok, err := f.store.Swap(ctx, "m", raw, old); !ok || err != nil {
		t.Fatalf("swap: %v %v", ok, err)
	}
	other := f.controller(nil)
	other.Tick(ctx)
	c.Tick(ctx)
	if other.ArmSeed("m") == 0 || c.ArmSeed("m") != other.ArmSeed("m") || other.Share("m") != 0.05 {
		t.Errorf("seeds %x and %x, share %v", other.ArmSeed("m"), c.ArmSeed("m"), other.Share("m"))
	}
}

func TestSharedStateInMemory(t *testing.T) { testSharedState(t, NewMemoryStore()) }

func TestSharedStateInRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	testSharedState(t, NewRedisStore(client))
}

func TestRedisStoreSwapsOnlyTheStateItRead(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	s := NewRedisStore(client)
	ctx := context.Background()
	if b, err := s.Load(ctx, "m"); err != nil || b != nil {
		t.Fatalf("empty: %q %v", b, err)
	}
	if ok, err := s.Swap(ctx, "m", nil, []byte("one")); !ok || err != nil {
		t.Fatalf("first write: %v %v", ok, err)
	}
	if ok, _ := s.Swap(ctx, "m", nil, []byte("two")); ok {
		t.Fatal("a swap from no state replaced one")
	}
	if ok, _ := s.Swap(ctx, "m", []byte("stale"), []byte("two")); ok {
		t.Fatal("a swap from a stale state applied")
	}
	if ok, _ := s.Swap(ctx, "m", []byte("one"), []byte("two")); !ok {
		t.Fatal("a swap from the current state failed")
	}
	if b, _ := s.Load(ctx, "m"); string(b) != "two" {
		t.Fatalf("state %q", b)
	}
}

func TestANewPlanStartsOver(t *testing.T) {
	f := newFixture(t, NewMemoryStore(), "", "m")
	c := f.controller(nil)
	ctx := context.Background()
	c.Tick(ctx)
	f.passStep(c)
	if f.status(c).Step != 1 {
		t.Fatal("setup: not at step 2")
	}
	// Other steps: another rollout, from its compatibility gate.
	data, _ := os.ReadFile(f.path)
	f.write(strings.Replace(string(data), "percent: 5,", "percent: 10,", 1))
	if err := f.pols.Reload(); err != nil {
		t.Fatal(err)
	}
	c.Tick(ctx)
	if s := f.status(c); s.Phase != Progressing || s.Step != 0 || c.Share("m") != 0.1 {
		t.Fatalf("after the plan changed: %+v", s)
	}
}

func TestStoreUnreachableKeepsTheShare(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	f := newFixture(t, NewRedisStore(client), "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	srv.Kill()
	c.Tick(context.Background())
	if c.Share("m") != 0.05 {
		t.Fatalf("share %v after Redis went away", c.Share("m"))
	}
}

func FuzzParseModelList(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
	f.Add([]byte(`{"data":null}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := parseModelList(b)
		if err == nil && ids == nil {
			t.Fatal("no error and no list")
		}
	})
}

// At 100 % the baseline takes no requests: the candidate is judged against the baseline's last full window.
func TestTheLastStepJudgesAgainstTheBaselinesLastWindow(t *testing.T) {
	for _, tc := range []struct {
		ttft time.Duration
		want Phase
	}{{200 * time.Millisecond, Promoted}, {700 * time.Millisecond, RolledBack}} {
		f := newFixture(t, NewMemoryStore(), "", "m")
		c := f.controller(nil)
		c.Tick(context.Background())
		f.passStep(c)
		f.passStep(c)
		if s := f.status(c); s.Step != 2 || c.Share("m") != 1 {
			t.Fatalf("setup: %+v", s)
		}
		f.clock.Advance(50 * time.Second)
		for range 40 {
			c.Settled(settle(picker.ArmCandidate, true, "ok", tc.ttft))
		}
		f.clock.Advance(11 * time.Second) // the baseline's requests have left the window
		c.Tick(context.Background())
		if s := f.status(c); s.Phase != tc.want || s.Gates == nil || s.Gates.BaselineRequests != 40 {
			t.Errorf("candidate TTFT %v at 100%%: %+v gates %+v, want %s against the baseline's 40", tc.ttft, s, s.Gates, tc.want)
		}
	}
}

// A candidate that is another served model name runs on the baseline's engines: every one must list it.
func TestCompatibilityOfAServedModelCandidate(t *testing.T) {
	for _, tc := range []struct {
		ids  []string
		want Phase
	}{{[]string{"m"}, Checking}, {[]string{"m", "m-int4"}, Progressing}} {
		f := newFixture(t, NewMemoryStore(), "", "m")
		pol := fmt.Sprintf(controllerPolicy, engine(t, tc.ids...), engine(t, "m", "m-int4"), "", "")
		f.write(strings.Replace(pol, "candidate: {pool: v2}", "candidate: {servedModel: m-int4}", 1))
		if err := f.pols.Reload(); err != nil {
			t.Fatal(err)
		}
		c := f.controller(nil)
		c.Tick(context.Background())
		if s := f.status(c); s.Phase != tc.want || s.Candidate != "servedModel:m-int4" {
			t.Errorf("engines listing %v: %+v, want %s", tc.ids, s, tc.want)
		}
	}
}

// The baseline's reference for a 100 % step lives in the shared state: a replica restarted during the step
// judges the candidate against it.
func TestTheLastStepSurvivesARestart(t *testing.T) {
	store := NewMemoryStore()
	f := newFixture(t, store, "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	f.passStep(c)
	f.passStep(c)
	restarted := f.controller(nil)
	restarted.Tick(context.Background())
	if s := f.status(restarted); s.Step != 2 || s.State.Baseline == nil || s.State.Baseline.Requests != 40 {
		t.Fatalf("after the restart: %+v", s.State)
	}
	f.clock.Advance(50 * time.Second)
	for range 40 {
		restarted.Settled(settle(picker.ArmCandidate, true, "ok", 800*time.Millisecond))
	}
	f.clock.Advance(11 * time.Second)
	restarted.Tick(context.Background())
	if s := f.status(restarted); s.Phase != RolledBack {
		t.Fatalf("a slow candidate at 100 %% after a restart: %+v %+v", s.State, s.Gates)
	}
}

// A stored state that cannot be in force (a step the plan does not have) starts the rollout over instead of
// taking the controller down.
func TestACorruptStateStartsOver(t *testing.T) {
	store := NewMemoryStore()
	f := newFixture(t, store, "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	raw, _ := store.Load(context.Background(), "m")
	bad := strings.Replace(string(raw), `"step":0`, `"step":7`, 1)
	if ok, _ := store.Swap(context.Background(), "m", raw, []byte(bad)); !ok {
		t.Fatal("setup")
	}
	c.Tick(context.Background())
	if s := f.status(c); s.Phase != Progressing || s.Step != 0 {
		t.Fatalf("%+v", s.State)
	}
}

// flakyStore loses every swap while lose is set (another replica keeps writing, or Redis fails).
type flakyStore struct {
	*MemoryStore
	lose bool
}

func (s *flakyStore) Swap(ctx context.Context, model string, old, next []byte) (bool, error) {
	if s.lose {
		return false, nil
	}
	return s.MemoryStore.Swap(ctx, model, old, next)
}

// A failed gate takes the candidate's share to 0 at once, even when the state cannot be saved yet; the next
// tick saves the rollback.
func TestAFailedGateHoldsWhileUnsaved(t *testing.T) {
	store := &flakyStore{MemoryStore: NewMemoryStore()}
	f := newFixture(t, store, "", "m")
	c := f.controller(nil)
	c.Tick(context.Background())
	f.passStep(c)
	store.lose = true
	f.clock.Advance(time.Second)
	feed(c, 25, 700*time.Millisecond, 200*time.Millisecond, "ok")
	f.clock.Advance(time.Second)
	c.Tick(context.Background())
	if c.Share("m") != 0 {
		t.Fatalf("share %v after a failed gate that could not be saved", c.Share("m"))
	}
	store.lose = false
	f.clock.Advance(time.Minute) // the slow requests have left the window: the failure must not be forgotten
	c.Tick(context.Background())
	raw, _ := store.Load(context.Background(), "m")
	if !strings.Contains(string(raw), `"phase":"rolled_back"`) || c.Share("m") != 0 {
		t.Fatalf("stored %s, share %v", raw, c.Share("m"))
	}
}

// A rollout with a shadow phase gives the candidate no client request until copies of the baseline's have
// passed the gates: then the first step starts; a candidate whose copies fail is rolled back before any client
// reached it.
func TestShadowPhaseJudgesCopiesBeforeAnyTraffic(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttft time.Duration
		want Phase
	}{{"healthy copies", 200 * time.Millisecond, Progressing}, {"slow copies", 900 * time.Millisecond, RolledBack}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, NewMemoryStore(), "      shadow: {percent: 20, minDuration: 1m, minRequests: 30}", "m")
			c := f.controller(nil)
			ctx := context.Background()
			c.Tick(ctx)
			if s := f.status(c); s.Phase != Shadowing || c.Share("m") != 0 || c.ShadowShare("m") != 0.2 {
				t.Fatalf("after the compatibility gate: %+v, share %v, shadow %v", s, c.Share("m"), c.ShadowShare("m"))
			}
			f.clock.Advance(50 * time.Second) // past the 30 s warm-up
			for range 40 {
				c.Settled(settle(picker.ArmBaseline, true, "ok", 200*time.Millisecond))
				cp := settle(picker.ArmCandidate, true, "ok", tc.ttft)
				cp.Shadow = true
				c.Settled(cp)
			}
			f.clock.Advance(11 * time.Second)
			c.Tick(ctx)
			s := f.status(c)
			if s.Phase != tc.want || c.ShadowShare("m") != 0 {
				t.Fatalf("%+v, shadow share %v", s, c.ShadowShare("m"))
			}
			switch tc.want {
			case Progressing:
				if s.Step != 0 || c.Share("m") != 0.05 {
					t.Errorf("the first step: %+v share %v", s, c.Share("m"))
				}
			case RolledBack:
				if c.Share("m") != 0 || !strings.HasPrefix(s.Reason, "shadow: TTFT") {
					t.Errorf("rolled back with share %v: %q", c.Share("m"), s.Reason)
				}
			}
		})
	}
}
