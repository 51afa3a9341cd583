package picker

import "time"

// The other gateway replicas' long prompts. SLO placement predicts a request's TTFT from the prefill ahead of it
// at the endpoint (aheadTokens): the engine's waiting requests at its last reading, and the sends since, still
// in prefill, that this replica knows of. With N replicas it knows only its own. The engine's token counters
// (engineshare.go) bring the others' prefill into the decode share, but a reading later, and never into the
// prefill ahead: a replica sent a chat request behind another replica's 30K-token prompt, started a moment ago
// on an H200, predicts it served at once. So each replica publishes the long prompts it sends (Placement.Prefill:
// the endpoint, the uncached tokens, when the first token is due), and the others count them, from when they
// hear of them until they are due, in the prefill ahead and the prefill share, as they count their own. Only
// prompts that take at least publishedPrefill at the endpoint's stated speed are published: the short ones are
// what the engine's waiting count and counters already tell well enough, and the bound keeps the messages to at
// most 1 ÷ publishedPrefill a second per endpoint prefilling, however many requests the fleet serves.

// publishedPrefill is the least prefill time, at the endpoint's stated speed, of a prompt whose sending is
// published.
const publishedPrefill = 100 * time.Millisecond

// MaxPublishedPrefill bounds the uncached tokens a published prompt may claim (16M: more than any model's
// context), and MaxPrefillDue how long after it is heard of it may count as in prefill.
const (
	MaxPublishedPrefill = 1 << 24
	MaxPrefillDue       = 10 * time.Minute
)

// publishPrefill tells the other replicas of the prompt the decision sent, when it is long: the whole request's
// at its endpoint, or a split's prefill leg at its prefiller (a split's booking at its decoder prefills nothing
// there).
func (d *decision) publishPrefill(dec *Decision) {
	if d.p.Placements == nil || !dec.Predicted.set || len(dec.Endpoints) == 0 {
		return
	}
	ep, pd := dec.Endpoints[0], dec.Predicted
	if dec.Prefill != "" {
		ep, pd = dec.Prefill, dec.prefillPred
	}
	if !pd.set || pd.uncached < 1 {
		return
	}
	c := d.candidate(ep)
	if c == nil || pd.uncached < c.speed.PrefillTokensPerSecond*publishedPrefill.Seconds() {
		return
	}
	d.p.Placements.Publish(Placement{Endpoint: ep, Prefill: int(min(pd.uncached, MaxPublishedPrefill)), Due: pd.TTFT + pd.tail})
}

// learnPrefill counts another replica's long prompt, heard of at now and due in due, among the endpoint's
// others' sends. An endpoint this replica has not predicted for yet has nothing to count it in.
func (p *predictor) learnPrefill(ep string, uncached float64, due time.Duration, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.eps[ep]
	if m == nil {
		return
	}
	m.engine.prefilledKnown(&m.others[m.othersNext])
	m.others[m.othersNext] = sentPrompt{at: now, firstBy: now.Add(due), uncached: uncached}
	m.engine.sentKnown(&m.others[m.othersNext])
	m.othersNext = (m.othersNext + 1) % recentSends
}

// settleOthers counts the others' prompts due by a reading at readAt among the known ones prefilled: their
// first token is expected out by then, and no other news of it comes.
func (m *endpointModel) settleOthers(readAt time.Time) {
	for i := range m.others {
		if s := &m.others[i]; !s.counted && !s.at.IsZero() && !readAt.Before(s.firstBy) {
			m.engine.prefilledKnown(s)
		}
	}
}
