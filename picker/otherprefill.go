package picker

import (
	"math/rand/v2"
	"time"
)

// The other gateway replicas' long prompts. SLO placement predicts a request's TTFT from the prefill ahead of it
// at the endpoint (aheadTokens): the engine's waiting requests at its last reading, and the sends since, still
// in prefill, that this replica knows of. With N replicas it knows only its own. The engine's token counters
// (engineshare.go) bring the others' prefill into the decode share, but a reading later, and never into the
// prefill ahead: a replica sent a chat request behind another replica's 30K-token prompt, started a moment ago
// on an H200, predicts it served at once. So each replica publishes the long prompts it sends (Placement.Prefill:
// the endpoint, the uncached tokens, when the first token is due), and the others count them, from when they
// hear of them until they are due, in the prefill ahead and the prefill share, as they count their own. A split
// is published at both ends, as this replica books it (predictSplit): its prefill leg at its prefiller, and its
// booking at its decoder (Placement.Booked), which counts in the decoder's prefill ahead only. When the first
// token passes (or the request settles without one), the sender reports the prompt done (Placement.Done), and
// the others release it as the sender releases its own; one no such news reaches (the sender gone, the message
// lost, the send out of the sender's recent ones) they hold until it is due at the tail of its prediction. Held to that tail, short prompts made an endpoint look busy long after they were
// done, and SLO placement moved a conversation's follow-ups off the replica that held its prefix (make
// bench-routing, two replicas). Only prompts that take at least
// publishedPrefill at the endpoint's stated speed are published: the engine's waiting count and counters tell
// the short ones, and the bound keeps the messages to at most 1 ÷ publishedPrefill a second per endpoint
// prefilling (twice that for splits, and as many again when done), however many requests the fleet serves.

// publishedPrefill is the least prefill time, at the endpoint's stated speed, of a prompt whose sending is
// published. Over make bench-pd's family with four replicas (BENCHMARKS.md; measured before prompts were
// reported done), 250 ms published the bursts' long prompts only, not chat's uncached openings on the slower
// class, and aggregated serving missed 40 % more requests than at 100 ms; 50 ms missed 6 % more.
const publishedPrefill = 100 * time.Millisecond

// MaxPublishedPrefill bounds the uncached tokens a published prompt may claim (1M: the longest contexts
// served), and MaxPrefillDue how long after it is heard of it may count: a message forged where the replicas
// share no key (docs/security.md) makes an endpoint look busy for at most that long.
const (
	MaxPublishedPrefill = 1 << 20
	MaxPrefillDue       = time.Minute
)

// publishPrefill tells the other replicas of the prompt the decision sent, when it is long: a whole request's at
// its endpoint, or a split's prefill leg at its prefiller and its booking at its decoder.
func (d *decision) publishPrefill(dec *Decision) {
	if d.p.Placements == nil || !dec.Predicted.set || len(dec.Endpoints) == 0 {
		return
	}
	if dec.Prefill == "" {
		dec.news = d.publishSent(dec.Endpoints[0], dec.Predicted, false)
		return
	}
	dec.prefillNews = d.publishSent(dec.Prefill, dec.prefillPred, false)
	dec.news = d.publishSent(dec.Endpoints[0], dec.Predicted, true)
}

// publishSent publishes the send to ep that pd predicted (booked: a split's booking at its decoder), when it
// takes at least publishedPrefill there, and returns the message's id (0: not published). The id is random: a
// receiver drops a replay by it, and the done message names the prompt by it.
func (d *decision) publishSent(ep string, pd Prediction, booked bool) uint64 {
	if !pd.set || pd.uncached < 1 {
		return 0
	}
	c := d.candidate(ep)
	if c == nil || pd.uncached < c.speed.PrefillTokensPerSecond*publishedPrefill.Seconds() {
		return 0
	}
	id := rand.Uint64() | 1 // never 0
	d.p.Placements.Publish(Placement{Endpoint: ep, Prefill: int(min(pd.uncached, MaxPublishedPrefill)),
		Due: pd.TTFT + pd.tail, Booked: booked, ID: id})
	return id
}

// publishDone tells the other replicas that the long prompts a decision published have their first token out,
// at the ends this replica has just released (see Prefilled).
func (p *Affinity) publishDone(d *Decision, released, prefillReleased bool) {
	if p.Placements == nil {
		return
	}
	if released && d.news != 0 && len(d.Endpoints) > 0 {
		p.Placements.Publish(Placement{Endpoint: d.Endpoints[0], ID: d.news, Done: true})
	}
	if prefillReleased && d.prefillNews != 0 {
		p.Placements.Publish(Placement{Endpoint: d.Prefill, ID: d.prefillNews, Done: true})
	}
}

// learnDone releases another replica's long prompt of that id at ep, if it holds it: its first token is out. It
// reports false for an endpoint this replica has not predicted for.
func (p *predictor) learnDone(ep string, id uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.eps[ep]
	if m == nil {
		return false
	}
	if s := m.otherByID(id); s != nil && !s.counted {
		m.prefilled(s)
	}
	return true
}

// otherByID is the others' prompt of that id held at the endpoint, nil when none is.
func (m *endpointModel) otherByID(id uint64) *sentPrompt {
	for i := range m.others {
		if s := &m.others[i]; s.id == id && !s.at.IsZero() {
			return s
		}
	}
	return nil
}

// learnPrefill counts another replica's long prompt (id, uncached tokens; booked: a split's booking at its
// decoder), heard of at now and due in due, among the endpoint's others' sends. It reports false for an endpoint
// this replica has not predicted for yet, which has nothing to count it in; a replay of one it holds is dropped.
func (p *predictor) learnPrefill(ep string, id uint64, uncached float64, due time.Duration, booked bool, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.eps[ep]
	if m == nil {
		return false
	}
	if m.otherByID(id) != nil {
		return true
	}
	m.engine.prefilledKnown(&m.others[m.othersNext])
	m.others[m.othersNext] = sentPrompt{at: now, firstBy: now.Add(due), uncached: uncached, remote: booked, id: id}
	m.engine.sentKnown(&m.others[m.othersNext])
	m.othersNext = (m.othersNext + 1) % recentSends
	return true
}

// settleOthers counts the others' prompts due by a reading at readAt among the known ones prefilled: their
// first token is expected out by then, and no other news of it comes.
func (m *endpointModel) settleOthers(readAt time.Time) {
	if !m.heardOthers() {
		return
	}
	for i := range m.others {
		if s := &m.others[i]; !s.counted && !s.at.IsZero() && !readAt.Before(s.firstBy) {
			m.engine.prefilledKnown(s)
		}
	}
}
