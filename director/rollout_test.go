package director

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

type fixedShare float64

func (s fixedShare) Share(string) float64 { return float64(s) }

func (s fixedShare) ArmSeed(string) uint64 { return 42 }

func (s fixedShare) ShadowShare(string) float64 { return 0 }

// The quickstart with the llama model's L40S pool released as the candidate of a rollout; acme may test it.
func rolloutSnapshot(t *testing.T) *policies.Snapshot {
	t.Helper()
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    fallbacks:\n    - name: together", "    rollout:\n      candidate: {pool: llama70b-l40s}\n"+
		"      steps: [{percent: 10}, {percent: 100}]\n      testers: [acme]\n    fallbacks:\n    - name: together", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestRouteSplitsARolledOutModel(t *testing.T) {
	snap := rolloutSnapshot(t)
	for _, tc := range []struct {
		name, key, header string
		share             fixedShare
		wantPool, wantArm string
	}{
		{"no share yet: the baseline", "sk-demo-globex", "", 0, "llama70b-h200", picker.ArmBaseline},
		{"a tester asks for the candidate", "sk-demo-acme", "candidate", 0.0001, "llama70b-l40s", picker.ArmCandidate},
		{"a tester asks before the candidate takes traffic", "sk-demo-acme", "candidate", 0, "llama70b-h200", picker.ArmBaseline},
		{"a tester asks for the baseline", "sk-demo-acme", "baseline", 1, "llama70b-h200", picker.ArmBaseline},
		{"someone else's header is ignored", "sk-demo-globex", "candidate", 0, "llama70b-h200", picker.ArmBaseline},
		{"an unknown arm is ignored", "sk-demo-acme", "l40s", 0, "llama70b-h200", picker.ArmBaseline},
		{"promoted: the candidate", "sk-demo-globex", "", 1, "llama70b-l40s", picker.ArmCandidate},
	} {
		var heard []Settlement
		busy := &fleet.InFlight{} // two requests at every engine already: the settlement says so
		m, _ := snap.Model("llama-70b")
		for _, p := range m.Pools {
			for _, ep := range p.Endpoints {
				busy.Start(ep)
				busy.Start(ep)
			}
		}
		d := New(Options{Policies: policies.NewStaticStore(snap), Rollouts: tc.share, InFlight: busy,
			Observers: []SettleObserver{ObserverFunc(func(s Settlement) { heard = append(heard, s) })}})
		tenant, _ := snap.TenantForKey(tc.key)
		body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"llama-70b","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		rt := &Route{}
		err = d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body,
			RolloutArm: tc.header, Conversation: "c1"}, rt)
		body.Release()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rt.Pool() != tc.wantPool || rt.Decision.Arm != tc.wantArm {
			t.Errorf("%s: pool %s arm %q, want %s %q", tc.name, rt.Pool(), rt.Decision.Arm, tc.wantPool, tc.wantArm)
		}
		d.Settle(rt, Outcome{Status: 200})
		chosen := tc.header != "" && tc.key == "sk-demo-acme" && tc.header != "l40s" && (tc.header == "baseline" || tc.share > 0)
		if len(heard) != 1 || heard[0].Arm != tc.wantArm || heard[0].ArmChosen != chosen || heard[0].Load != 2 {
			t.Errorf("%s: settlements %+v", tc.name, heard)
		}
	}
}

// shadowing is a rollout in its shadow phase: no share, every request sampled for a copy.
type shadowing struct{}

func (shadowing) Share(string) float64       { return 0 }
func (shadowing) ArmSeed(string) uint64      { return 42 }
func (shadowing) ShadowShare(string) float64 { return 1 }

// copies records what the director hands the shadow sender; built holds each copy's body, built as Send would.
type copies struct {
	all      []ShadowCopy
	built    []string
	answered []string
}

func (c *copies) Send(cp ShadowCopy) bool {
	c.all, c.built = append(c.all, cp), append(c.built, string(cp.Body()))
	return true
}

func (c *copies) Answered(id string, ok bool, text []byte) {
	c.answered = append(c.answered, fmt.Sprintf("%s %v %s", id, ok, text))
}

// In the shadow phase a baseline request still goes to the baseline, and a copy of it, asking for the
// candidate's name, goes to the shadow sender with the candidate's engines; the client's own settlement is
// the baseline's and the only one the observers hear (the copy is settled by the sender, uncharged).
func TestShadowPhaseCopiesBaselineRequests(t *testing.T) {
	src, err := os.ReadFile("../examples/quickstart/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    fallbacks:\n    - name: together", "    rollout:\n      candidate: {pool: llama70b-l40s}\n"+
		"      steps: [{percent: 10}, {percent: 100}]\n      shadow: {percent: 50}\n    fallbacks:\n    - name: together", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	// The same with regions: the candidate's L40S pool in eu-west, and the tenant pinned to us-east.
	regional := strings.NewReplacer("  tiers:", "  regions: [{name: us-east}, {name: eu-west}]\n  tiers:",
		"      hardwareClass: h200\n", "      hardwareClass: h200\n      region: us-east\n",
		"    - name: llama70b-l40s\n      hardwareClass: l40s-x4\n", "    - name: llama70b-l40s\n      hardwareClass: l40s-x4\n      region: eu-west\n",
		"    - name: qwen7b-l40s\n      hardwareClass: l40s\n", "    - name: qwen7b-l40s\n      hardwareClass: l40s\n      region: us-east\n",
		"    tier: pro\n", "    tier: pro\n    residency: [us-east]\n").Replace(text)
	pinned, err := policies.Parse("policy.yaml", []byte(regional))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		snap     *policies.Snapshot
		rollouts Rollouts
		copies   int
	}{{"shadowing", snap, shadowing{}, 1}, {"progressing", snap, fixedShare(0), 0},
		{"shadowing a tenant pinned outside the candidate's region", pinned, shadowing{}, 0}} {
		snap := tc.snap
		sent := &copies{}
		var heard []Settlement
		d := New(Options{Policies: policies.NewStaticStore(snap), Rollouts: tc.rollouts, Shadows: sent,
			Observers: []SettleObserver{ObserverFunc(func(s Settlement) { heard = append(heard, s) })}})
		tenant, _ := snap.TenantForKey("sk-demo-globex")
		body, err := openai.ParseRequest(openai.EndpointChat, []byte(`{"model":"llama-70b","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		rt := &Route{}
		if err := d.Route(context.Background(), Request{Snapshot: snap, Tenant: tenant, Endpoint: openai.EndpointChat, Body: &body,
			RequestID: "r1"}, rt); err != nil {
			t.Fatal(err)
		}
		if rt.Decision.Arm != picker.ArmBaseline || rt.Pool() != "llama70b-h200" {
			t.Errorf("%s: the client's request went to %s (%s)", tc.name, rt.Pool(), rt.Decision.Arm)
		}
		if len(sent.all) != tc.copies {
			t.Fatalf("%s: %d copies, want %d", tc.name, len(sent.all), tc.copies)
		}
		if tc.copies > 0 {
			cp := sent.all[0]
			if cp.Plan == nil || cp.Plan.Share != 0.5 || cp.HardwareClass != "l40s-x4" || len(cp.Endpoints) == 0 || !cp.Stream ||
				!strings.Contains(sent.built[0], `"stream_options":{"include_usage":true}`) && !strings.Contains(sent.built[0], `"include_usage"`) {
				t.Errorf("copy %+v body %s", cp, sent.built[0])
			}
			var served struct{ Model string }
			if err := json.Unmarshal([]byte(sent.built[0]), &served); err != nil || served.Model == "llama-70b" || served.Model == "" {
				t.Errorf("the copy asks for %q: want the candidate's served name", served.Model)
			}
		}
		body.Release()
		d.Settle(rt, Outcome{Status: 200})
		if len(heard) != 1 || heard[0].Shadow || heard[0].Arm != picker.ArmBaseline {
			t.Errorf("%s: observers heard %+v", tc.name, heard)
		}
	}
}
