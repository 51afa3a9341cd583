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
// in the share already.

// engineReadings is how many of an endpoint's readings with token counters the picker keeps: a prefill window's
// worth at a scrape every second or two.
const engineReadings = 16

// engineCount is an engine's counters at one reading, and this gateway's own tokens sent there and prefilled
// by then.
type engineCount struct {
	at             time.Time
	prompt, cached float64 // the engine's counters, since it started
	// sent and prefilled are this gateway's own (engineCounts.ownSent when the reading was first seen, and
	// ownPrefilled when the one before it was: no later than the reading was taken, so that a first token that
	// came after it is not taken off).
	sent, prefilled float64
}

// engineCounts are an endpoint's recent readings with counters, newest at at[next−1], and this gateway's own
// tokens there.
type engineCounts struct {
	at   [engineReadings]engineCount
	next int
	// ownSent sums the uncached tokens of this gateway's sends there (a split's booking at its decoder
	// excepted); ownPrefilled those of the sends whose first token is out, or that left the recent sends before
	// it was seen (their prefill long done by then, or the request failed).
	ownSent, ownPrefilled float64
	// notedPrefilled is ownPrefilled when the last reading was noted.
	notedPrefilled float64
	// rate is othersRate's figure as of the newest reading, reckoned when it was noted: it changes with readings
	// only, and decisions read it for every candidate.
	rate float64
}

// note records reading c of the endpoint, once, when it carries both token counters. A counter that went back
// (an engine restarted) starts the record afresh; the difference of the two may go back as it is, since engines
// count a prompt's tokens and its cache hits at different moments.
func (e *engineCounts) note(c *scored) {
	if !c.counted {
		return
	}
	last := &e.at[(e.next+engineReadings-1)%engineReadings]
	if !last.at.IsZero() && !c.readAt.After(last.at) {
		return
	}
	if !last.at.IsZero() && (c.prompt < last.prompt || c.cached < last.cached) {
		e.at = [engineReadings]engineCount{}
	}
	e.at[e.next] = engineCount{at: c.readAt, prompt: c.prompt, cached: c.cached, sent: e.ownSent, prefilled: e.notedPrefilled}
	e.next = (e.next + 1) % engineReadings
	e.notedPrefilled = e.ownPrefilled
	e.rate = e.reckon()
}

// othersRate is the prefill other gateway replicas brought the engine, in tokens a second (reckon), while the
// newest reading is not older than prefillWindow.
func (e *engineCounts) othersRate(now time.Time) float64 {
	newest := e.at[(e.next+engineReadings-1)%engineReadings]
	if newest.at.IsZero() || now.Sub(newest.at) > prefillWindow {
		return 0
	}
	return e.rate
}

// reckon is the others' rate over the readings within prefillWindow of the newest: the engine's computed tokens
// less the most of this gateway's own it can have counted, floored at 0. It is 0 until the readings span a
// second.
func (e *engineCounts) reckon() float64 {
	newest := e.at[(e.next+engineReadings-1)%engineReadings]
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

// sentOwn counts a send's tokens among this gateway's own sent there.
func (e *engineCounts) sentOwn(s *sentPrompt) { e.ownSent += s.uncached }

// sentRemote takes a split's booking at its decoder out of this gateway's own sent there: its prefill runs on
// its prefiller.
func (e *engineCounts) sentRemote(s *sentPrompt) {
	if s.remote {
		return
	}
	s.remote = true
	e.ownSent -= s.uncached
	if s.counted {
		e.ownPrefilled -= s.uncached
	}
}

// prefilledOwn counts a send's tokens among this gateway's own prefilled there, once: when its first token is
// out, or when it leaves the recent sends unseen. A split's booking at its decoder prefilled nothing there.
func (e *engineCounts) prefilledOwn(s *sentPrompt) {
	if s.at.IsZero() || s.counted {
		return
	}
	s.counted = true
	if !s.remote {
		e.ownPrefilled += s.uncached
	}
}
