package director

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
)

type fixedShare float64

func (s fixedShare) Share(string) float64 { return float64(s) }

func (s fixedShare) ArmSeed(string) uint64 { return 42 }

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
		d := New(Options{Policies: policies.NewStaticStore(snap), Rollouts: tc.share,
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
		if len(heard) != 1 || heard[0].Arm != tc.wantArm || heard[0].ArmChosen != chosen {
			t.Errorf("%s: settlements %+v", tc.name, heard)
		}
	}
}
