package shadow

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/policies"
)

// A paired copy's answer and the baseline's are joined by request id, whichever comes first, and handed to the
// judge once; a pair with an error on either side, or an answer for no copy, goes nowhere.
func TestPairsJoinBothAnswers(t *testing.T) {
	ep, _ := engine(t, 0, nil)
	failing, _ := engine(t, 500, nil)
	var mu sync.Mutex
	var judged []director.ShadowPair
	s := New(Options{Pairs: func(p director.ShadowPair) {
		mu.Lock()
		defer mu.Unlock()
		judged = append(judged, p)
	}})
	plan := &policies.ShadowPlan{MaxConcurrent: 8, MaxPerSecond: 100}
	for _, tc := range []struct {
		id, endpoint string
		baseFirst    bool
		baseOK       bool
	}{{"before", ep, true, true}, {"after", ep, false, true}, {"base failed", ep, false, false}, {"copy failed", failing, false, true}} {
		c := copyFor(tc.endpoint, plan)
		c.RequestID, c.Pair = tc.id, true
		if tc.baseFirst {
			s.Answered(tc.id, tc.baseOK, []byte("base:"+tc.id))
		}
		if !s.Send(c) {
			t.Fatal("not sent")
		}
		s.Wait()
		if !tc.baseFirst {
			s.Answered(tc.id, tc.baseOK, []byte("base:"+tc.id))
		}
	}
	s.Answered("never copied", true, []byte("x"))
	if len(judged) != 1 {
		t.Fatalf("%d pairs judged, want 1: %+v", len(judged), judged)
	}
	p := judged[0]
	if p.RequestID != "after" || string(p.Baseline) != "base:after" || string(p.Candidate) != "Hello!" || p.Model != "m" ||
		string(p.Request) != `{"model":"m-next","stream":true}` {
		t.Errorf("pair %+v", p)
	}
	// An answer that came before its copy was sent is not kept: "before" never became a pair.
	if len(s.pairs.pending) != 1 || s.pairs.pending["before"] == nil {
		t.Errorf("pending %v", s.pairs.pending)
	}
}

// The pairs waiting for an answer are bounded; past the bound, one older than the TTL makes room.
func TestPendingPairsAreBounded(t *testing.T) {
	var p pairs
	now := time.Unix(1000, 0)
	for i := range maxPendingPairs {
		if !p.open("m", fmt.Sprint(i), nil, now) {
			t.Fatalf("pair %d refused", i)
		}
	}
	if p.open("m", "one more", nil, now) {
		t.Fatal("a pair past the bound")
	}
	if !p.open("m", "later", nil, now.Add(pairTTL+time.Second)) || len(p.pending) != 1 {
		t.Fatalf("expired pairs not dropped: %d pending", len(p.pending))
	}
	if p.open("m", "", nil, now) || p.open("m", "later", nil, now) {
		t.Fatal("a pair without an id, or twice")
	}
	big := strings.Repeat("x", 10)
	if _, whole := p.answer("later", 0, true, []byte(big)); whole {
		t.Fatal("whole with one side")
	}
	if pair, whole := p.answer("later", 1, true, []byte("b")); !whole || string(pair.Candidate) != big {
		t.Fatalf("pair %+v whole %v", pair, whole)
	}
}
