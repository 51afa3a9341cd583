package picker

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"github.com/infergate/infergate/policies"
)

// Rollout arms, as Decision.Arm and the tester header name them.
const (
	ArmCandidate = "candidate"
	ArmBaseline  = "baseline"
)

// Split is a rollout's division of a model's traffic for one decision: the candidate's current share of
// conversation groups, or the arm a tester chose for their own request.
type Split struct {
	Plan  *policies.RolloutPlan
	Share float64 // 0..1
	// Force is ArmCandidate or ArmBaseline when a tenant the plan allows as a tester asked for one; "" lets the
	// request's group decide.
	Force string
	// Conversation, when not zero, names the request's conversation (the policy's conversation header,
	// hashed, else openai.Request.ConversationKey): it decides the arm instead of the prompt's prefix group,
	// so that conversations sharing a long system prompt — one prefix group — still split by the share.
	Conversation uint64
	// Ungrouped names a request with neither a conversation nor a full prompt block (a short completion or
	// embedding input): a hash of its request id, so such requests split by the share rather than all together.
	Ungrouped uint64
	// Seed is the rollout's secret (Rollouts.ArmSeed): it keys the arms' hash, so that a client choosing its
	// conversation id or request id cannot choose its arm — and push slow requests into a candidate to have it
	// rolled back.
	Seed uint64
}

// arm decides a request's arm from its conversation group: the group's hash, keyed by the rollout's secret
// seed and the model, read as a number in [0,1), below the share goes to the candidate. A group keeps its arm as the share grows (a step
// only adds groups to the candidate), so a conversation does not bounce between arms and lose its KV cache;
// a rollback (share 0) returns every group to the baseline at once.
func (s *Split) arm(model string, group uint64) string {
	if s.Force != "" {
		return s.Force
	}
	u := float64(xxh3.HashStringSeed(model, xxh3.HashSeed(seedBytes(s.Seed), group))>>11) / (1 << 53)
	if u < s.Share {
		return ArmCandidate
	}
	return ArmBaseline
}

// seedBytes spells a seed as the bytes the arm hash keys on.
func seedBytes(seed uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	return b[:]
}

// inArm says whether a pool serves an arm: the candidate's pool, or — for a candidate that is a served model
// name — the baseline pools, which serve it under that name. Pools compare by name: a request queued across a
// policy reload is placed among the new snapshot's pools with the plan it was routed under.
func (s *Split) inArm(pool *policies.Pool, arm string) bool {
	if arm == ArmCandidate && s.Plan.Candidate != nil {
		return pool.Name == s.Plan.Candidate.Name
	}
	for _, b := range s.Plan.Baseline {
		if b.Name == pool.Name {
			return true
		}
	}
	return false
}

// inArmOnly keeps the candidates of one arm, in buf (cands stays whole for the other arm; a second call
// overwrites the first's list).
func (s *Split) inArmOnly(cands []scored, arm string, buf *[]scored) []scored {
	kept := (*buf)[:0]
	for _, c := range cands {
		if s.inArm(c.pool, arm) {
			kept = append(kept, c)
		}
	}
	*buf = kept
	return kept
}

// annotate records the arm in a decision and, for a candidate that is a served model name, the name the body
// is rewritten to. A decision for the managed fallback has no arm.
func (s *Split) annotate(d Decision, arm string) Decision {
	if d.Fallback != nil {
		return d
	}
	d.Arm = arm
	if arm == ArmCandidate && s.Plan.Candidate == nil {
		d.ServedAs = s.Plan.CandidateServed
	}
	return d
}
