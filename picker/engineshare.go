package picker

import "time"

// The prefill share (prefillShare) counts what this gateway sent an endpoint. With N gateway replicas sharing
// the fleet that is about 1 ÷ N of what the engine prefills, and SLO placement would predict a replica that
// draws the others' long prompts as fast to decode as an idle one. Engines that count their prompt tokens and
// those their cache held (fleet.EngineMetrics) tell the rest: the tokens an engine computed between two
// readings, less this gateway's own among them, are the other replicas' (and whatever this gateway's cache
// predictions missed). An engine counts a prompt somewhere between its admission and its first token, so of
// this gateway's own, those counted between the readings are at most the ones sent by the second less those
// whose first token was out by the first. That is what is taken off: the uncached tokens of a long prompt of its
// own in prefill at a reading, which the engine counted already, do not read as another replica's. (An engine
// that counts a prompt's tokens at its first token and its cache hits on admission, as vLLM does, can show the
// cached part of such a prompt for one window.) The difference is floored at 0: this gateway's own are counted
// in the share already. The long prompts other replicas published (Placement.Prefill, otherprefill.go) are
// counted in the share as they arrive, and taken off the counters as this gateway's own are: "known" below is
// both, and the counters tell only the rest.

// engineReadings is how many of an endpoint's readings with token counters the picker keeps, at least
// engineSpacing apart: a prefill window's worth whatever the scrape interval. Kept as they came, readings every
// 100 ms spanned 1.5 s, over which one prompt this gateway's index predicted cached, and the engine prefilled
// whole, read as another replica's prefill at six times its share of the window.
const (
	engineReadings = 16
	engineSpacing  = prefillWindow / (engineReadings - 1)
)

// engineCount is an engine's counters at one reading, and the known tokens (this gateway's own and the others'
// published) sent there and prefilled by then.
type engineCount struct {
	at             time.Time
	prompt, cached float64 // the engine's counters, since it started
	// sent and prefilled are the known tokens (engineCounts.knownSent when the reading was first seen, and
	// knownPrefilled when the one before it was: no later than the reading was taken, so that a first token that
	// came after it is not taken off).
	sent, prefilled float64
}

// engineCounts are an endpoint's recent readings with counters, newest at at[next−1] (at least engineSpacing
// apart), the latest one, and the known tokens there.
type engineCounts struct {
	at     [engineReadings]engineCount
	next   int
	latest engineCount
	// knownSent sums the uncached tokens of this gateway's sends there (a split's booking at its decoder
	// excepted) and of the long prompts other replicas published; knownPrefilled those whose first token is out
	// (a published one's: due by a reading), or that left their ring before it was seen (their prefill long
	// done by then, or the request failed).
	knownSent, knownPrefilled float64
	// notedPrefilled is knownPrefilled when the last reading was noted.
	notedPrefilled float64
	// rate is othersRate's figure as of the newest reading, reckoned when it was noted: it changes with readings
	// only, and decisions read it for every candidate.
	rate float64
}

// note records reading c of the endpoint, once, when it carries both token counters. A counter that went back
// (an engine restarted) starts the record afresh; the difference of the two may go back as it is, since engines
// count a prompt's tokens and its cache hits at different moments.
func (e *engineCounts) note(c *scored) {
	if !e.fresh(c) {
		return
	}
	if !e.latest.at.IsZero() && (c.prompt < e.latest.prompt || c.cached < e.latest.cached) {
		e.at, e.latest = [engineReadings]engineCount{}, engineCount{}
	}
	e.latest = engineCount{at: c.readAt, prompt: c.prompt, cached: c.cached, sent: e.knownSent, prefilled: e.notedPrefilled}
	if last := e.at[(e.next+engineReadings-1)%engineReadings]; last.at.IsZero() || e.latest.at.Sub(last.at) >= engineSpacing {
		e.at[e.next] = e.latest
		e.next = (e.next + 1) % engineReadings
	}
	e.notedPrefilled = e.knownPrefilled
	e.rate = e.reckon()
}

// fresh says whether reading c carries both token counters and is newer than the last one noted.
func (e *engineCounts) fresh(c *scored) bool {
	return c.counted && (e.latest.at.IsZero() || c.readAt.After(e.latest.at))
}

// othersRate is the prefill other gateway replicas brought the engine beyond the long prompts they published, in
// tokens a second (reckon), while the newest reading is not older than prefillWindow.
func (e *engineCounts) othersRate(now time.Time) float64 {
	if e.latest.at.IsZero() || now.Sub(e.latest.at) > prefillWindow {
		return 0
	}
	return e.rate
}

// reckon is the others' rate from the oldest reading kept within prefillWindow of the latest to the latest: the
// engine's computed tokens less the most of the known ones it can have counted, floored at 0. It is 0 until the
// readings span a second.
func (e *engineCounts) reckon() float64 {
	newest := e.latest
	oldest := newest
	for _, r := range e.at {
		if !r.at.IsZero() && r.at.Before(oldest.at) && newest.at.Sub(r.at) <= prefillWindow {
			oldest = r
		}
	}
	span := newest.at.Sub(oldest.at).Seconds()
	if span < 1 {
		return 0
	}
	computed := (newest.prompt - oldest.prompt) - (newest.cached - oldest.cached)
	return max(0, computed-(newest.sent-oldest.prefilled)) / span
}

// sentKnown counts a send's tokens (this gateway's or a published one) among the known ones sent there; a
// split's booking at its decoder, published, prefills nothing there.
func (e *engineCounts) sentKnown(s *sentPrompt) {
	if !s.remote {
		e.knownSent += s.uncached
	}
}

// sentRemote takes a split's booking at its decoder out of the known tokens sent there: its prefill runs on its
// prefiller.
func (e *engineCounts) sentRemote(s *sentPrompt) {
	if s.remote {
		return
	}
	s.remote = true
	e.knownSent -= s.uncached
	if s.counted {
		e.knownPrefilled -= s.uncached
	}
}

// prefilledKnown counts a send's tokens among the known ones prefilled there, once: when its first token is out
// (or, published, due by a reading), or when it leaves its ring unseen. A split's booking at its decoder
// prefilled nothing there.
func (e *engineCounts) prefilledKnown(s *sentPrompt) {
	if s.at.IsZero() || s.counted {
		return
	}
	s.counted = true
	if !s.remote {
		e.knownPrefilled += s.uncached
	}
}
