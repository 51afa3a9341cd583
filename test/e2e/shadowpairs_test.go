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

// With shadowPairs, a judge scores pairs of real answers — a client's answer from the baseline and the
// candidate's answer to its copy — and the shadow phase passes only once enough pairs are judged and the
// candidate scores within the margin. The judge is sent both texts and the request, as the candidate was asked.
func TestRolloutShadowPairs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var judged, empty atomic.Int64
	judge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ask struct {
			Case                string
			Request             json.RawMessage
			Baseline, Candidate string
		}
		if json.NewDecoder(r.Body).Decode(&ask) != nil || ask.Case != "shadow" || !strings.Contains(string(ask.Request), `"messages"`) {
			http.Error(w, "want a shadow pair", http.StatusBadRequest)
			return
		}
		if ask.Baseline == "" || ask.Candidate == "" {
			empty.Add(1)
		}
		judged.Add(1)
		fmt.Fprint(w, `{"baseline": 1, "candidate": 1}`)
	}))
	t.Cleanup(judge.Close)
	shadow := "      shadow: {percent: 50, minDuration: 2s, minRequests: 20, maxConcurrent: 4, maxPerSecond: 50}\n" +
		fmt.Sprintf("      eval: {margin: 0.1, shadowPairs: {webhook: %q, minPairs: 10}}\n", judge.URL)
	policy := strings.Replace(rolloutPolicy(t, 3600e9), "      testers: [qa]", shadow+"      testers: [qa]", 1)
	st := rolloutStackWith(t, ctx, nil, policy)
	ctl := st.Gateway.Rollouts
	wait.Within(t, "the shadow phase", rolloutLimit, func() bool { return status(t, ctl).Phase == rollout.Shadowing })
	load := startLoad([]string{st.URL}, 4)
	wait.Within(t, "the shadow phase to pass", rolloutLimit, func() bool {
		s := status(t, ctl)
		if s.Phase == rollout.RolledBack {
			t.Fatalf("rolled back in the shadow phase: %s", s.Reason)
		}
		return s.Phase == rollout.Progressing
	})
	load.end(t)
	if judged.Load() < 10 || empty.Load() > 0 {
		t.Errorf("the judge scored %d pairs (want at least 10), %d of them with an empty answer", judged.Load(), empty.Load())
	}
}
