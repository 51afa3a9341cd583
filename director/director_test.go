package director

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/quota"
)

func quickstart(t *testing.T) *policies.Snapshot {
	t.Helper()
	snap, err := policies.LoadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// Route counts the request in flight and says how to edit its body; Settle ends it exactly once and tells
// every observer.
func TestRouteAndSettleOnce(t *testing.T) {
	snap := quickstart(t)
	inflight := &fleet.InFlight{}
	var heard []Settlement
	d := New(Options{Policies: policies.NewStaticStore(snap), InFlight: inflight,
		Observers: []SettleObserver{ObserverFunc(func(s Settlement) { heard = append(heard, s) })}})
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"llama-70b","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer body.Release()
	rt := &Route{}
	if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body, RequestID: "r1"}, rt); err != nil {
		t.Fatal(err)
	}
	if inflight.Total() != 1 {
		t.Errorf("in flight %d after Route", inflight.Total())
	}
	if !rt.Edits.IncludeUsage || rt.Edits.MaxTokens != int64(snap.Gateway().DefaultMaxTokens) || rt.Edits.Model == "" {
		t.Errorf("edits %+v: want include_usage, the default max_tokens and the served name", rt.Edits)
	}
	st := d.Settle(rt, Outcome{Status: 200, Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 2}, Reported: true})
	if st.Result != "completed" || st.Usage.Total() != 7 || st.RequestID != "r1" || st.Pool != rt.Pool() {
		t.Errorf("settlement %+v", st)
	}
	if again := d.Settle(rt, Outcome{Aborted: true}); again != (Settlement{}) || len(heard) != 1 {
		t.Errorf("a second Settle counted: %+v, observers heard %d", again, len(heard))
	}
	if inflight.Total() != 0 {
		t.Errorf("in flight %d after Settle", inflight.Total())
	}
}

func TestRouteRefusals(t *testing.T) {
	snap := quickstart(t)
	d := New(Options{Policies: policies.NewStaticStore(snap)})
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	for body, reason := range map[string]Reason{
		`{"model":"nope","messages":[{"role":"user","content":"x"}]}`:                             ModelNotFound,
		`{"model":"llama-70b","messages":[{"role":"user","content":"x"}],"max_tokens":999999999}`: OutputTooLarge,
	} {
		req, err := openai.ParseRequest(openai.EndpointChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		err = d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &req}, &Route{})
		req.Release()
		var r *Refusal
		if !errors.As(err, &r) || r.Reason != reason {
			t.Errorf("%s: %v, want reason %d", body, err, reason)
		}
	}
}

// recordingPicker keeps the inputs it was asked to place.
type recordingPicker struct {
	picker.Picker
	inputs []picker.Input
}

func (r *recordingPicker) Pick(snap *policies.Snapshot, in picker.Input) (picker.Decision, error) {
	r.inputs = append(r.inputs, in)
	return r.Picker.Pick(snap, in)
}

// recordingAdmission keeps what admission reserved.
type recordingAdmission struct{ reserved []int64 }

func (r *recordingAdmission) Admit(_ context.Context, q quota.Request) (*quota.Ticket, *quota.Rejection, error) {
	r.reserved = append(r.reserved, q.EstimatedTokens)
	return nil, nil, nil
}

func (r *recordingAdmission) Settle(*quota.Ticket, int64, int64) {}

// The picker prices the output bound admission reserves: the policy's defaultMaxTokens when the client asked
// none, the client's max_tokens otherwise (issue #32: the picker once priced 256 tokens of its own).
func TestPickerPricesWhatQuotaReserves(t *testing.T) {
	raw, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := policies.Parse("policy.yaml", bytes.Replace(raw, []byte("defaultMaxTokens: 256"), []byte("defaultMaxTokens: 1024"), 1))
	if err != nil {
		t.Fatal(err)
	}
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	for _, tc := range []struct {
		body string
		want int64
	}{
		{`{"model":"llama-70b","messages":[{"role":"user","content":"hi"}]}`, 1024},
		{`{"model":"llama-70b","max_tokens":77,"messages":[{"role":"user","content":"hi"}]}`, 77},
		{`{"model":"llama-70b","max_tokens":77,"n":4,"messages":[{"role":"user","content":"hi"}]}`, 308}, // every sequence
	} {
		rec := &recordingPicker{Picker: picker.NewAffinity(&fleet.InFlight{}, nil)}
		adm := &recordingAdmission{}
		d := New(Options{Policies: policies.NewStaticStore(snap), Picker: rec, Admission: adm})
		body, err := openai.ParseRequest(openai.EndpointChat, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		rt := &Route{}
		if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body}, rt); err != nil {
			t.Fatal(err)
		}
		prompt := int64(body.EstimatePromptTokens())
		body.Release()
		if len(rec.inputs) != 1 || len(adm.reserved) != 1 {
			t.Fatalf("%s: %d picks, %d admissions", tc.body, len(rec.inputs), len(adm.reserved))
		}
		priced, reserved := rec.inputs[0].OutputTokens, adm.reserved[0]-prompt
		if priced != tc.want || reserved != tc.want {
			t.Errorf("%s: the picker priced %d output tokens, quota reserved %d, want %d for both", tc.body, priced, reserved, tc.want)
		}
	}
}

// A settlement without the engine's usage charges the prompt estimate and the output delivered: a stream's
// content events, a JSON body's text at four bytes a token, or — where the protocol stage did not see the body —
// the output bound admission reserved (here the policy's default max_tokens, 256).
func TestUnreportedUsageIsChargedWhatWasDelivered(t *testing.T) {
	snap := quickstart(t)
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	for _, tc := range []struct {
		name   string
		stream bool
		o      Outcome
		want   int64
	}{
		{"stream seen", true, Outcome{Status: 200, BodySeen: true, ContentEvents: 9}, 9},
		{"JSON seen", false, Outcome{Status: 200, BodySeen: true, OutputTextBytes: 41}, 11},
		{"JSON seen, empty", false, Outcome{Status: 200, BodySeen: true}, 0},
		{"stream not seen", true, Outcome{Status: 200, ContentEvents: 9}, 256},
		{"JSON not seen, client gone", false, Outcome{Aborted: true, Status: 200}, 256},
		{"upstream error", true, Outcome{Status: 503, BodySeen: true, ContentEvents: 3}, 0},
		{"reported", true, Outcome{Status: 200, Reported: true, Usage: openai.Usage{PromptTokens: 4, CompletionTokens: 7}}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(Options{Policies: policies.NewStaticStore(snap)})
			stream := "false"
			if tc.stream {
				stream = "true"
			}
			body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"llama-70b","stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer body.Release()
			rt := &Route{}
			if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body}, rt); err != nil {
				t.Fatal(err)
			}
			if st := d.Settle(rt, tc.o); st.Usage.CompletionTokens != tc.want {
				t.Errorf("charged %d output tokens, want %d (%+v)", st.Usage.CompletionTokens, tc.want, st.Usage)
			}
		})
	}
}

// A request for more sequences than the policy's maxChoices is refused before anything is reserved.
func TestTooManyChoicesRefused(t *testing.T) {
	snap := quickstart(t) // maxChoices defaults to 16
	tenant, _ := snap.TenantForKey("sk-demo-acme")
	adm := &recordingAdmission{}
	d := New(Options{Policies: policies.NewStaticStore(snap), Admission: adm})
	for _, tc := range []struct {
		body    string
		refused bool
	}{
		{`{"model":"llama-70b","n":16,"messages":[{"role":"user","content":"hi"}]}`, false},
		{`{"model":"llama-70b","n":17,"messages":[{"role":"user","content":"hi"}]}`, true},
	} {
		body, err := openai.ParseRequest(openai.EndpointChat, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		rt := &Route{}
		err = d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body}, rt)
		body.Release()
		var r *Refusal
		if got := errors.As(err, &r) && r.Reason == TooManyChoices; got != tc.refused {
			t.Errorf("%s: refused %v (%v), want %v", tc.body, got, err, tc.refused)
		}
		if err == nil {
			d.Settle(rt, Outcome{Status: 200})
		}
	}
	if len(adm.reserved) != 1 {
		t.Errorf("%d admissions, want only the request within the cap reserved", len(adm.reserved))
	}
}

// A routed settlement names its GenAI provider (gen_ai.provider.name): the pool's engine, or the managed API's
// fallback name.
func TestSettlementNamesTheProvider(t *testing.T) {
	pool := &policies.Pool{Name: "h200", HardwareClass: "h200", Engine: "vllm", ServedModel: "meta/llama"}
	for _, tc := range []struct {
		name            string
		decision        picker.Decision
		provider, class string
	}{
		{"a pool", picker.Decision{Pool: pool}, "vllm", "h200"},
		{"a managed API", picker.Decision{Pool: pool, Fallback: &policies.Fallback{Name: "together", Model: "llama-turbo"}}, "together", ManagedClass},
		{"not routed", picker.Decision{}, "", ""},
	} {
		rt := &Route{tenant: &policies.Tenant{Name: "acme"}, Model: &policies.Model{Name: "llama"}, Decision: tc.decision}
		if st := rt.settlement(); st.Provider != tc.provider || st.HardwareClass != tc.class {
			t.Errorf("%s: provider %q class %q, want %q and %q", tc.name, st.Provider, st.HardwareClass, tc.provider, tc.class)
		}
	}
}
