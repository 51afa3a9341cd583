package director

import (
	"context"
	"errors"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/policies"
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
