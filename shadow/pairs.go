package shadow

import (
	"sync"
	"time"

	"github.com/infergate/infergate/director"
)

// Bounds on the pairs waiting for their other answer: a baseline answer that never comes (the client left,
// the gateway restarted) must not hold memory.
const (
	maxPendingPairs = 1024
	pairTTL         = 10 * time.Minute
)

// pairs joins a paired copy's answer with the baseline's, by the request's id, and hands each whole pair whose
// two answers ended well to the judge (Options.Pairs).
type pairs struct {
	mu      sync.Mutex
	pending map[string]*halfPair
}

// halfPair is a pair waiting for one of its answers.
type halfPair struct {
	model, requestID string
	request          []byte
	opened           time.Time
	sides            [2]pairSide // candidate, baseline
}

type pairSide struct {
	in, ok bool
	text   []byte
}

// open starts waiting for a copy's two answers; false when too many pairs wait already (the copy is still
// sent, but not judged in a pair).
func (p *pairs) open(model, requestID string, request []byte, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending = map[string]*halfPair{}
	}
	if len(p.pending) >= maxPendingPairs {
		for id, h := range p.pending {
			if now.Sub(h.opened) > pairTTL {
				delete(p.pending, id)
			}
		}
	}
	if len(p.pending) >= maxPendingPairs || requestID == "" || p.pending[requestID] != nil {
		return false
	}
	p.pending[requestID] = &halfPair{model: model, requestID: requestID, request: request, opened: now}
	return true
}

// answer records one side's answer (side 0 the candidate's, 1 the baseline's) and returns the whole pair when
// the other side is in and both ended well.
func (p *pairs) answer(requestID string, side int, ok bool, text []byte) (director.ShadowPair, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.pending[requestID]
	if h == nil || h.sides[side].in {
		return director.ShadowPair{}, false
	}
	h.sides[side] = pairSide{in: true, ok: ok, text: text}
	other := h.sides[1-side]
	if !other.in {
		return director.ShadowPair{}, false
	}
	delete(p.pending, requestID)
	if !ok || !other.ok {
		return director.ShadowPair{}, false // an error is the error gate's to judge, not the judge's
	}
	return director.ShadowPair{Model: h.model, RequestID: requestID, Request: h.request, Candidate: h.sides[0].text,
		Baseline: h.sides[1].text}, true
}

// Answered implements director.Shadows: the baseline's side of a pair.
func (s *Sender) Answered(requestID string, ok bool, text []byte) {
	if pair, whole := s.pairs.answer(requestID, 1, ok, text); whole {
		s.judge(pair)
	}
}

// judge hands a whole pair to the judge, if one is wired.
func (s *Sender) judge(pair director.ShadowPair) {
	s.copies.WithLabelValues(pair.Model, "paired").Inc()
	if s.opts.Pairs != nil {
		s.opts.Pairs(pair)
	}
}
