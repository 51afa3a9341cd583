package extproc

import (
	"testing"
	"time"

	"github.com/infergate/infergate/picker"
)

// The x-infergate-scores header: the scorers' parts, then SLO placement's prediction, then, for a prompt that
// starts a group, its follow-ups' TTFT and the group's cost.
func TestFormatScores(t *testing.T) {
	parts := []picker.ScorePart{{Scorer: "prefix", Value: 1}, {Scorer: "load", Value: 0.5}}
	for _, tc := range []struct {
		name  string
		score picker.Score
		want  string
	}{
		{"affinity", picker.Score{Endpoint: "10.0.0.1:8000", Total: 2.5, Parts: parts},
			"10.0.0.1:8000;total=2.500;prefix=1.000;load=0.500"},
		{"slo", picker.Score{Endpoint: "10.0.0.1:8000", Total: 2.5, Parts: parts, TTFT: 120 * time.Millisecond, TPOT: 20 * time.Millisecond, CostUSD: 0.0012, MeetsSLO: true},
			"10.0.0.1:8000;total=2.500;prefix=1.000;load=0.500;ttft_ms=120.0;tpot_ms=20.0;cost_usd=0.0012;meets_slo=true"},
		{"slo, a new group", picker.Score{Endpoint: "10.0.0.1:8000", Total: 2.5, Parts: parts, TTFT: 620 * time.Millisecond, CostUSD: 0.0012,
			FollowUpTTFT: 80 * time.Millisecond, GroupCostUSD: 0.0052},
			"10.0.0.1:8000;total=2.500;prefix=1.000;load=0.500;ttft_ms=620.0;tpot_ms=0.0;cost_usd=0.0012;meets_slo=false;follow_ttft_ms=80.0;group_cost_usd=0.0052"},
	} {
		if got := formatScores([]picker.Score{tc.score}); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
