package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/test/wait"
)

// The eval gate runs the golden set against both arms' real engines before the candidate takes any traffic: with
// the same engine on both arms it passes and the first step starts; with a judge (a webhook) that scores the
// candidate's answers below the baseline's, the rollout is rolled back and no client request reached the
// candidate.
func TestRolloutEvalGate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		judge string // the webhook's answer
		want  rollout.Phase
	}{
		{"the same engine", `{"baseline": 1, "candidate": 1}`, rollout.Progressing},
		{"a worse judgement", `{"baseline": 1, "candidate": 0.25}`, rollout.RolledBack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			var judged atomic.Int64
			judge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var ask struct{ Case, Baseline, Candidate string }
				if json.NewDecoder(r.Body).Decode(&ask) != nil || ask.Baseline == "" || ask.Candidate == "" {
					http.Error(w, "want both answers", http.StatusBadRequest)
					return
				}
				judged.Add(1)
				fmt.Fprint(w, tc.judge)
			}))
			t.Cleanup(judge.Close)
			eval := "      eval:\n        margin: 0.05\n        cases:\n" +
				`        - {name: words, messages: [{role: user, content: "Say a few words."}], maxTokens: 8, regex: '^(\w+ )+$'}` + "\n" +
				`        - {name: prose, prompt: "Once upon a time", maxTokens: 8, regex: '\w'}` + "\n" +
				fmt.Sprintf("        - {name: judged, messages: [{role: user, content: \"Tell a story.\"}], maxTokens: 8, webhook: %q}\n", judge.URL)
			policy := strings.Replace(rolloutPolicy(t, 3600e9), "      testers: [qa]", eval+"      testers: [qa]", 1)
			if !strings.Contains(policy, "eval:") {
				t.Fatal("examples/rollout/policy.yaml lost its testers line")
			}
			st := rolloutStackWith(t, ctx, nil, policy)
			ctl := st.Gateway.Rollouts
			var s rollout.Status
			wait.Within(t, "the eval gate's verdict", rolloutLimit, func() bool {
				s = status(t, ctl)
				return s.Phase != "" && s.Phase != rollout.Checking && s.Phase != rollout.Evaluating // "": before the first tick
			})
			if s.Phase != tc.want || s.Eval == nil || s.Eval.Cases != 3 || judged.Load() != 1 {
				t.Fatalf("%s: %q, report %+v, judged %d times", s.Phase, s.Reason, s.Eval, judged.Load())
			}
			var asked int64
			for _, name := range []string{"chat-v2-0", "chat-v2-1"} {
				r, _ := st.Fleet.Replica(name)
				asked += r.Received()
			}
			if asked != 3 {
				t.Errorf("the candidate's engines received %d requests, want the golden set's 3", asked)
			}
			if tc.want == rollout.RolledBack {
				for i := range 5 {
					if by := servedBy(t, st.URL, "sk-demo-acme", "", i); !strings.HasPrefix(by, "chat-v1-") {
						t.Fatalf("a client's request after the failed eval gate was served by %s", by)
					}
				}
				if !strings.Contains(s.Reason, "eval gate: candidate passed 75.0% of 3 cases, the baseline 100.0%") {
					t.Errorf("reason %q", s.Reason)
				}
			}
		})
	}
}
