package picker

import (
	"math"
	"sync"
	"time"
)

// Prediction is what the picker expected of the chosen destination: its time to first token and time per
// output token, and what serving the request there costs. The director hands it back with the observed
// timing (ObserveTiming), which is how the predictions learn, and traces and debugScores show it.
type Prediction struct {
	// TTFT is the predicted time from routing to the first token.
	TTFT time.Duration
	// TPOT is the predicted time per output token; 0 until the endpoint has reported enough to predict it.
	TPOT time.Duration
	// CostUSD is the estimated cost of the request at the destination: GPU time for its uncached prompt and
	// its output at the hardware's price, or the provider's price for a managed API.
	CostUSD float64

	ttftX, tpotX [fitDims]float64
	// idle is the TTFT the endpoint would give the request with nothing queued or running; idleTPOT its TPOT
	// there, alone in the batch (0 while TPOT is unpredicted).
	idle, idleTPOT time.Duration
	// tail is how much later than TTFT the first token may come at the tail of its spread (see Judging at the
	// tail); meets judges TTFT + tail.
	tail time.Duration
	// rtt is the round trip to the endpoint's region, which TTFT and idle include (see Regions) and the
	// endpoint's own model never sees.
	rtt      time.Duration
	uncached float64
	// prefillShare is the share of the endpoint's time its engine is prefilling at the decision (see
	// prefillShare), a feature of the TPOT fit (shareTerm); tpotStep is the decode step the fit predicts there
	// without it, which running decodes take over 1 − the share (tpotWithPrefill).
	prefillShare float64
	tpotStep     time.Duration
	// decodeLeg is the TTFT a split's decode leg would see there, its KV cache pulled: the prefill ahead and
	// the batch's slots awaited, not its own prompt (see worthSplitting).
	decodeLeg time.Duration
	// sentAt is when the request was sent (SLO placement's clock), which finds it among its endpoint's recent
	// sends once it finishes.
	sentAt time.Time
	// factor is the pool's calibration factor at the decision; inTime says the prediction was judged to meet
	// the targets, limit and tpotLimit are those targets less what the request had waited, objective the tier's
	// and margin the policy's routing.sloMargin (see Calibration).
	factor, objective, margin float64
	limit, tpotLimit          time.Duration
	// legsLate counts the split requests' decode legs awaited there that the request's prefill would hold past
	// their first-token targets (see legsLate).
	legsLate int32
	inTime   bool
	set      bool
}

// The TTFT model of one endpoint. Before it has observations, the prediction is
//
//	TTFT ≈ step + (ahead + uncached) ÷ prefill speed + turnovers × service time
//
// where ahead is the prefill ahead of the request (see aheadTokens: the engine's waiting requests at ū each, ū
// the mean uncached prompt tokens of requests this gateway sent there, or this gateway's own sends still in
// prefill), uncached this prompt's tokens the endpoint does not hold, and the prefill speed the pool's (or its
// hardware class's). When the pool states its batch
// size (maxConcurrency, S), a request that finds the batch full waits for sequences to finish: turnovers =
// max(0, running + queued + 1 − S) ÷ S batches (or, when the KV cache is the tighter bound, kvAwaited ÷ S),
// each lasting about a request's service time, 256 output tokens at the per-sequence decode speed
// (decodeTokensPerSecond ÷ S). Observed TTFTs then fit
//
//	TTFT ≈ a + b × prefill seconds + c × turnovers
//
// per endpoint (see fit): a learns the engine's step time, b how much slower than the stated speed prefill
// really runs, c the real service time. When the pool states its batch size a fourth feature, running ÷ S,
// learns how much the decoding batch slows the steps a prefill shares with it (chunked prefill: every step
// carries the batch's decode). A prediction is never below the prefill time at the stated speed: a fit to a
// run of observations alike can extrapolate below what the hardware can do, and promise a slow class a TTFT
// it cannot give. Without a batch size the third feature is running ÷ 32 with no prior.
//
// TPOT is fitted on the running batch (running ÷ 32) and the prefill share ρ (prefillShare), as ρ ÷ (1 − ρ) (see
// tpotFeatures): with chunked prefill an engine runs the prefills it admits in the steps its running requests
// decode in, so a step lasts its decode plus its prefill chunk, and where prefill keeps coming at a share ρ of
// the engine's time a token comes every decode step ÷ (1 − ρ), the step plus the step × ρ ÷ (1 − ρ). How much of
// that a new request pays is learnt: a replica that draws bursts of long prompts keeps prefilling while the
// requests sent beside them decode; one whose share came from a few prompts its cache missed has prefilled them
// before the next requests decode, and held to step ÷ (1 − ρ) it was judged late while it served every TPOT in
// time (make bench-routing, near saturation: docs/slo-placement.md). A prediction is never below the step without
// the share. When the pool states its batch size, the prior is the hardware's step at a full batch, S ÷
// decodeTokensPerSecond, half of it fixed (reading the weights) and half growing with the batch (reading each
// sequence's KV cache), and the same on the share, all of it paid: so a replica is not packed past the TPOT
// target before it has reported its first TPOTs. Without a batch size TPOT is predicted only after
// minTPOTObservations, and the share has no prior: it costs what the TPOTs show (given the step learnt as its
// prior, make bench-routing's pools, which state none, served 6 % fewer requests in time near saturation). The
// decodes already running where a prefill is sent run in its steps whatever was learnt of new requests: they take
// the step the fit predicts without the share ÷ (1 − ρ) (tpotWithPrefill).
const (
	stepPrior           = 0.025 // seconds: one engine step on the GPUs of the hardware table
	runningScale        = 32.0
	minTPOTObservations = 8
	uncachedWeight      = 0.05 // EWMA weight of a request's uncached tokens in ū
)

// endpointModel is what the picker has learnt of one endpoint's timing.
type endpointModel struct {
	ttft, tpot fit
	// ttftSeen and tpotSeen count the TTFTs and TPOTs observed there.
	ttftSeen, tpotSeen int
	tpotPrior          bool    // the TPOT fit has a prior from the pool's batch size and decode speed
	uncached           float64 // ū, 0 until a request was sent
	// spread is the mean squared TTFT residual (seconds²), started again once the fit has settled (see Judging
	// at the tail): their mean until there are trustWindow of them, an exponential average over about
	// trustWindow after — not one that starts from 0, which judges a new endpoint's first requests at a tail a
	// fraction of its real one.
	spread    float64
	residuals float64 // how many residuals spread has seen since it started again
	// recent are the last sends there, newest at recent[next−1] (see aheadTokens and prefillShare).
	recent [recentSends]sentPrompt
	next   int
	// engine are the engine's token counters, for the prefill other gateway replicas brought it (engineshare.go).
	engine engineCounts
	// others are the long prompts other gateway replicas published they sent there, newest at
	// others[othersNext−1] (otherprefill.go).
	others     [recentSends]sentPrompt
	othersNext int
	// legs are the decode legs of the split requests among the recent sends (legs[i] is recent[i]'s), and legsBy
	// the latest first-token target among them: past it, none can be made late (legsLate). Beside the ring, not
	// in it: every walk of the ring for a decision's candidates reads each of its entries.
	legs   [recentSends]awaitedLeg
	legsBy time.Time
}

// awaitedLeg is a split request's decode leg at its decoder: when it is expected there (its KV cache pulled) and
// when its first token is due, at its TTFT target (zero: none).
type awaitedLeg struct{ at, by time.Time }

// sentPrompt is one request this gateway (or, among an endpoint's others, another replica) sent an endpoint:
// when (heard of, for another's), its uncached tokens, and when its first token was due at the tail of its
// prediction.
type sentPrompt struct {
	at, firstBy time.Time
	uncached    float64
	// remote marks a split request's booking at its decoder: its prefill runs on the prefiller
	// (predictSplit), so it counts in the prefill ahead but not in the prefill share.
	remote bool
	// counted: its tokens are among the known ones prefilled (engineCounts.prefilledKnown).
	counted bool
	// id is another replica's message id (Placement.ID), by which a replay is dropped.
	id uint64
}

// prefilled takes the send to ep that pd predicted out of those still in prefill (see forgetSend), and reports
// whether it was still there: the director reports a request prefilled at its first token and again as it
// settles.
func (p *predictor) prefilled(ep string, pd Prediction) (released bool) {
	p.onSend(ep, pd, func(m *endpointModel, i int) {
		released = !m.recent[i].firstBy.IsZero()
		m.prefilled(&m.recent[i])
	})
	return released
}

// prefilledRemotely marks the send to ep that pd predicted as a split request's booking at its decoder, whose
// prefill runs on its prefiller: it stays in the prefill ahead, and leaves the prefill share. Its decode leg is
// expected there at legAt and its first token due by legBy (see legsLate).
func (p *predictor) prefilledRemotely(ep string, pd Prediction, legAt, legBy time.Time) {
	p.onSend(ep, pd, func(m *endpointModel, i int) {
		m.engine.sentRemote(&m.recent[i])
		if legBy.IsZero() {
			return
		}
		m.legs[i] = awaitedLeg{at: legAt, by: legBy}
		if legBy.After(m.legsBy) {
			m.legsBy = legBy
		}
	})
}

// onSend applies f to the send to ep that pd predicted, at its place i in the ring of recent sends, while the
// ring still holds it.
func (p *predictor) onSend(ep string, pd Prediction, f func(m *endpointModel, i int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.eps[ep]; m != nil {
		if i := m.slotOf(pd); i >= 0 {
			f(m, i)
		}
	}
}

// forgetSend takes the send pd predicted out of those still in prefill (aheadTokens): its first token is out.
// It stays among the recent sends, whose prefill the engine ran in the steps its decodes share (prefillShare).
func (m *endpointModel) forgetSend(pd Prediction) {
	if s := m.sendOf(pd); s != nil {
		m.prefilled(s)
	}
}

// prefilled marks the send's first token out: it leaves the prefill ahead (aheadTokens), not the share, and its
// tokens count among this gateway's own that the engine's counters hold (engineCounts).
func (m *endpointModel) prefilled(s *sentPrompt) {
	s.firstBy = time.Time{}
	m.engine.prefilledKnown(s)
}

// remember adds a send to the recent ones, in place of the oldest.
func (m *endpointModel) remember(s sentPrompt) {
	m.engine.prefilledKnown(&m.recent[m.next])
	m.recent[m.next], m.legs[m.next] = s, awaitedLeg{}
	m.engine.sentKnown(&s)
	m.next = (m.next + 1) % recentSends
}

// sendOf is the send pd predicted among the endpoint's recent ones, nil once newer sends have taken its place.
func (m *endpointModel) sendOf(pd Prediction) *sentPrompt {
	if i := m.slotOf(pd); i >= 0 {
		return &m.recent[i]
	}
	return nil
}

// slotOf is the place in the ring of the send pd predicted, −1 once newer sends have taken it.
func (m *endpointModel) slotOf(pd Prediction) int {
	for i := range m.recent {
		if s := &m.recent[i]; s.at.Equal(pd.sentAt) && s.uncached == pd.uncached && !s.at.IsZero() {
			return i
		}
	}
	return -1
}

// recentSends is how many of an endpoint's last sends the picker remembers: more than one replica prefills
// within a TTFT target at any request rate a replica sustains.
const recentSends = 32

// aheadTokens are the prompt tokens the engine has to prefill before a new request's. The engine's reading
// says how many wait (counted at ū each), but not how much of its running batch is still in prefill, and a
// request sent since the reading is in neither; this gateway knows its own: every send whose first token is
// not yet due (at the tail of its prediction), at what it left uncached, and the long prompts other replicas
// published (otherprefill.go). The prefill ahead is the larger of the reading's waiting plus the sends since
// it, and the sends still in prefill: the first holds other gateways' short requests, the second the prefills
// the reading hid. Sends since the reading count whether or not others finished since: a finished request
// leaves the running batch, not the prefill queue. A burst of new groups' first prompts, each uncached, lands on
// one replica between two readings; counting them at ū — mostly cached follow-ups — or netting them against
// finished requests predicts a prefill queue a fraction of what it is. A split request counts at its decoder
// too, though its prefill runs on its prefiller (predictSplit, disaggregate.go says why).
func (m *endpointModel) aheadTokens(c *scored, mean float64, now time.Time) float64 {
	sinceReading, pending := inPrefill(&m.recent, c.readAt, now)
	if m.heardOthers() {
		othersSince, othersPending := inPrefill(&m.others, c.readAt, now)
		sinceReading, pending = sinceReading+othersSince, pending+othersPending
	}
	return max(float64(c.queue)*mean+sinceReading, pending)
}

// legsLate counts the split requests' decode legs awaited at the endpoint (prefilledRemotely) that a prompt
// predicted pd there now would hold past their first-token targets. Engines admit waiting requests first come,
// first served, and run the prefills they have started before they admit another, so a leg that arrives after
// the prompt waits for the prompt's prefill to end, and is late when it ends after the leg's first token was due
// and the leg was expected in time. The prompt's prefill starts once the prefill ahead of it is done — decodeLeg,
// the prediction without the prompt, less this gateway's splits' bookings in the prefill ahead (aheadTokens),
// which the engine does not prefill, at speed tokens a second — and lasts what the prompt adds to the prediction
// (TTFT − decodeLeg, at least its tokens at speed). A leg whose first token is out (prefilled) is no longer
// awaited.
func (m *endpointModel) legsLate(pd *Prediction, speed float64, now time.Time) (n int32) {
	if !now.Before(m.legsBy) {
		return 0
	}
	var booked float64
	for i := range m.recent {
		if s := &m.recent[i]; s.remote && now.Before(s.firstBy) {
			booked += s.uncached
		}
	}
	own := max(pd.TTFT-pd.decodeLeg, seconds(pd.uncached/speed))
	end := now.Add(max(0, pd.decodeLeg-seconds(booked/speed)) + own)
	for i := range m.recent {
		leg := &m.legs[i]
		if leg.by.IsZero() || m.recent[i].firstBy.IsZero() {
			continue
		}
		if !leg.at.Before(now) && leg.at.Before(end) && leg.at.Before(leg.by) && end.After(leg.by) {
			n++
		}
	}
	return n
}

// heardOthers says whether another replica ever published a prompt sent here: with one replica the others' ring
// stays empty, and a decision need not walk it for every candidate. The ring fills from its first slot.
func (m *endpointModel) heardOthers() bool { return !m.others[0].at.IsZero() }

// inPrefill sums the uncached tokens of the sends whose first token is not yet due: all of them (pending), and
// those sent after readAt.
func inPrefill(sends *[recentSends]sentPrompt, readAt, now time.Time) (sinceReading, pending float64) {
	for i := range sends {
		s := &sends[i]
		if s.at.IsZero() || !now.Before(s.firstBy) {
			continue
		}
		pending += s.uncached
		if s.at.After(readAt) {
			sinceReading += s.uncached
		}
	}
	return sinceReading, pending
}

// prefillWindow is the time over which the prefill share is reckoned: about a request's decode
// (priorServiceTokens at a step of tens of milliseconds). maxPrefillShare bounds the share: an engine whose steps
// carry a full prefill chunk still decodes in each of them.
const (
	prefillWindow   = 10 * time.Second
	maxPrefillShare = 0.9
)

// prefillShare is the share of the endpoint's engine time that goes to prefilling what this gateway sent it, and
// the long prompts other replicas published they sent it (otherprefill.go): the uncached tokens of those sends in
// the last prefillWindow, at speed (tokens a second), over the window. With chunked prefill a running decode
// shares its steps with every prefill admitted while it runs, whether that prefill's first token is out or not,
// so the share is of the sends made, not of the prefill still ahead. When all recentSends of a ring fall within
// the window, older ones were forgotten, and its rate is reckoned over the span of those remembered. A split's
// booking at its decoder does not count (its prefill runs on its prefiller). The other replicas' unpublished
// sends are not among them: their prefill comes from the engine's token counters (engineshare.go), and
// predictLocked adds it.
func (m *endpointModel) prefillShare(speed float64, now time.Time) float64 {
	share := sentShare(&m.recent, speed, now)
	if m.heardOthers() {
		share += sentShare(&m.others, speed, now)
	}
	return min(maxPrefillShare, share)
}

// sentShare is prefillShare's figure for one ring of sends.
func sentShare(sends *[recentSends]sentPrompt, speed float64, now time.Time) float64 {
	var tokens float64
	oldest, full := now, true
	for i := range sends {
		s := &sends[i]
		if s.at.IsZero() || now.Sub(s.at) > prefillWindow {
			full = false
			continue
		}
		oldest = minTime(oldest, s.at)
		if !s.remote {
			tokens += s.uncached
		}
	}
	span := prefillWindow
	if full {
		span = max(now.Sub(oldest), time.Second)
	}
	return min(maxPrefillShare, tokens/max(speed, 1)/span.Seconds())
}

// tpotWithPrefill is the TPOT of the decodes running at pd's endpoint, had its engine tokens more to prefill
// at speed within the prefill window: the decode step, over what the prefill share then leaves (see
// prefillShare). A prefill sent there runs in the steps they decode in, whatever the fit learnt of the share at
// which new requests were sent.
func tpotWithPrefill(pd Prediction, tokens, speed float64) time.Duration {
	share := min(maxPrefillShare, pd.prefillShare+tokens/max(speed, 1)/prefillWindow.Seconds())
	return seconds(pd.tpotStep.Seconds() / (1 - share))
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// predictTTFT is the endpoint's TTFT for features x (see features), never below the prefill time x[1] at the
// pool's stated speed: a fit to a run of observations alike can extrapolate below what the hardware can do.
func (m *endpointModel) predictTTFT(x [fitDims]float64) time.Duration {
	return seconds(max(x[1], m.ttft.predict(x)))
}

// predictor holds every endpoint's model (and each managed fallback's, keyed by its cluster name).
type predictor struct {
	mu  sync.Mutex
	eps map[string]*endpointModel
	// pressure is, per model, the share of recent SLO decisions that found every endpoint too busy to serve the
	// request in time, though an idle one would have (an exponential average over about pressureWindow
	// decisions).
	pressure map[string]float64
	// sacrificed is, per model, the share of recent SLO decisions that placed a new group's first request
	// late (see Group placement), over about sacrificeWindow decisions.
	sacrificed map[string]float64
	calib      map[poolKey]*calibration // see Calibration
	trust      map[string]*modelTrust   // by model: see Trust
	// distrusted is each model's trust at its last decision, for the metric to change only when it does.
	distrusted map[string]bool
}

// pressureWindow is how many decisions the pressure average spans; minPressure is the least pressure that
// counts as an overload, whatever the error budget: about three busy decisions among the last pressureWindow.
const (
	pressureWindow = 64
	minPressure    = 0.05
)

// noteDecision adds one SLO decision to its model's pressure (busy: every endpoint too busy for it) and share
// of sacrificed first requests (see Group placement).
func (p *predictor) noteDecision(model string, busy, sacrificed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteDecisionLocked(model, busy, sacrificed)
}

func (p *predictor) noteDecisionLocked(model string, busy, sacrificed bool) {
	if p.pressure == nil {
		p.pressure, p.sacrificed = map[string]float64{}, map[string]float64{}
	}
	p.pressure[model] += (indicator(busy) - p.pressure[model]) / pressureWindow
	p.sacrificed[model] += (indicator(sacrificed) - p.sacrificed[model]) / sacrificeWindow
}

// modelState is what one SLO decision reads of its model's learning, under the lock predictAll takes anyway.
type modelState struct {
	pressure, sacrificed    float64
	trusted, trustedChanged bool
}

func indicator(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// model returns ep's model, created with a service-time prior of service seconds and a full-batch TPOT prior
// of fullStep seconds at slots sequences (0: none; see the TTFT model).
func (p *predictor) model(ep string, service, fullStep, slots float64) *endpointModel {
	if p.eps == nil {
		p.eps = map[string]*endpointModel{}
	}
	m := p.eps[ep]
	if m == nil {
		m = &endpointModel{ttft: newFit(stepPrior, 1, service, 0).guarded(prefillTerm),
			tpot: newFit(0, 0, 0, 0).guarded(batchTerm, shareTerm, shareBatchTerm)}
		if fullStep > 0 && slots > 0 {
			fixed, perRunning := fullStep/2, fullStep/2*runningScale/slots
			m.tpot = newFit(fixed, perRunning, fixed, perRunning).guarded(batchTerm, shareTerm, shareBatchTerm)
			m.tpotPrior = true
		}
		p.eps[ep] = m
	}
	return m
}

// priorServiceTokens is the output of a typical request in an engine's batch, for the service-time prior: the
// requests a new one waits behind, not its own output (which is priced at the director's bound).
const priorServiceTokens = 256

// serviceTime is a candidate's service-time prior: 256 output tokens at the per-sequence decode speed, 0 when
// the pool states no batch size.
func serviceTime(c *scored) float64 {
	slots := float64(c.pool.MaxConcurrency)
	if slots <= 0 {
		return 0
	}
	return priorServiceTokens * slots / max(c.speed.DecodeTokensPerSecond, 1)
}

// fullStepTime is a candidate's decode step at a full batch, S ÷ decodeTokensPerSecond (0 when the pool
// states no batch size).
func fullStepTime(c *scored) float64 {
	slots := float64(c.pool.MaxConcurrency)
	if slots <= 0 || c.speed.DecodeTokensPerSecond <= 0 {
		return 0
	}
	return slots / c.speed.DecodeTokensPerSecond
}

// prefillTerm is the TTFT features' prefill seconds; batchTerm, shareTerm and shareBatchTerm the TPOT features'
// running batch, prefill share and their product (tpotFeatures): the terms their fits guard (see fit).
const (
	prefillTerm    = 1
	batchTerm      = 1
	shareTerm      = 2
	shareBatchTerm = 3
)

// tpotFeatures are the TPOT fit's features for a running batch and a prefill share ρ: 1 and running ÷ 32 (the
// decode step), and each times ρ ÷ (1 − ρ), by which a decode step ÷ (1 − ρ) exceeds the step (see the model
// above).
func tpotFeatures(running, share float64) [fitDims]float64 {
	r, q := max(0, running)/runningScale, share/(1-min(share, maxPrefillShare))
	return [fitDims]float64{1, r, q, r * q}
}

// features are a candidate's TTFT features (see the model above).
func features(c *scored, prefill float64) [fitDims]float64 {
	slots := float64(c.pool.MaxConcurrency)
	if slots <= 0 {
		return [fitDims]float64{1, prefill, max(0, c.running) / runningScale}
	}
	return [fitDims]float64{1, prefill, slotsAwaited(c, slots) / slots, min(max(0, c.running), slots) / slots}
}

// slotsAwaited is how many of a full batch's sequences must finish before a request sent to c now is admitted:
// running + queued (the engine's waiting and this gateway's sends since) + 1 − S, at least 0; or, when more,
// those that must finish before the engine's KV cache holds it (kvAwaited).
func slotsAwaited(c *scored, slots float64) float64 {
	return max(c.kvAwaited, c.running+max(0, float64(c.queue)+c.since)+1-slots)
}

// kvAwaited is how many running sequences must finish before the engine's KV cache has room for a request
// that needs blocks of it (its uncached prompt and its output bound: an engine that reserves a request's
// blocks when it admits it, as fleetsim does and TensorRT-LLM's guaranteed-no-evict scheduler, or whose
// running batch grows into them, as vLLM's does), after the requests queued before it, each taking a running
// sequence's mean share: the cache's usage u over its running sequences r. A batch below its stated size can
// be full all the same — a 70B model's KV cache on a 48 GB card holds fewer long sequences than the engine's
// max_num_seqs — and a request that finds it so waits for sequences to finish as at a full batch. 0 when the
// engine reports no usage or capacity.
func kvAwaited(c *scored, blocks float64) float64 {
	if c.capacity <= 0 || c.kvUtil <= 0 || c.running < 1 {
		return 0
	}
	perSeq := min(1, c.kvUtil) / c.running
	short := max(0, float64(c.queue)+c.since)*perSeq + blocks/float64(c.capacity) - (1 - min(1, c.kvUtil))
	if short <= 0 {
		return 0
	}
	return math.Ceil(short/perSeq - 1e-9) // whole sequences, not one more for a rounding error
}

// predictAll fills each candidate's prediction for a prompt whose uncached tokens depend on what the endpoint
// holds, and whose output is outTokens long, and, when the prompt starts a group, its follow-ups' TTFT; it
// returns what the decision needs of the model's learning (trust, pressure, sacrifices). One lock for the
// whole decision (and one more in sent, once it is decided).
func (p *predictor) predictAll(model string, cands []scored, pr *prompt, outTokens float64, plan groupPlan, objective float64, now time.Time) (st modelState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st.pressure, st.sacrificed = p.pressure[model], p.sacrificed[model]
	st.trusted, st.trustedChanged = p.trustedLocked(model, cands, objective)
	z := tailZ(objective)
	for i := range cands {
		c := &cands[i]
		ahead := p.predictLocked(c, pr, outTokens, z, now)
		c.pred.factor = p.factorLocked(poolKey{model, c.pool.Name})
		if plan.followUps > 0 { // a follow-up of the group: its shared part cached
			x := features(c, (ahead+plan.followUncached)/max(c.speed.PrefillTokensPerSecond, 1))
			c.grp = groupFigures{followTTFT: p.eps[c.endpoint].predictTTFT(x)}
		}
	}
	return st
}

// predictLocked fills one candidate's prediction (the model above) for a prompt of which it holds c.matched
// blocks and an output of outTokens, with the tail at z, and returns the prefill it found ahead (tokens).
func (p *predictor) predictLocked(c *scored, pr *prompt, outTokens, z float64, now time.Time) (ahead float64) {
	blockTokens := pr.engineBlockTokens()
	uncached := max(0, float64(pr.tokens)-float64(c.matched)*blockTokens)
	m := p.model(c.endpoint, serviceTime(c), fullStepTime(c), float64(c.pool.MaxConcurrency))
	mean := m.uncached
	if mean == 0 {
		mean = uncached
	}
	speed := max(c.speed.PrefillTokensPerSecond, 1)
	c.kvAwaited = kvAwaited(c, (uncached+outTokens)/blockTokens)
	ahead = m.aheadTokens(c, mean, now)
	x := features(c, (ahead+uncached)/speed)
	pd := Prediction{ttftX: x, uncached: uncached, set: true}
	pd.TTFT, pd.idle = m.predictTTFT(pd.ttftX), m.predictTTFT([fitDims]float64{1, uncached / speed})
	pd.decodeLeg = m.predictTTFT(features(c, ahead/speed))
	pd.legsLate = m.legsLate(&pd, speed, now)
	pd.tail = m.tail(c, z, p.spreadOfLocked(c))
	if m.engine.fresh(c) {
		m.settleOthers(c.readAt)
		m.engine.note(c)
	}
	pd.prefillShare = min(maxPrefillShare, m.prefillShare(speed, now)+m.engine.othersRate(now)/speed)
	pd.tpotX = tpotFeatures(c.running, pd.prefillShare)
	if m.tpotPrior || m.tpotSeen >= minTPOTObservations {
		// Never faster for the share: a slope fitted below 0 is noise.
		pd.tpotStep = seconds(max(0, m.tpot.predict(tpotFeatures(c.running, 0))))
		pd.TPOT = max(pd.tpotStep, seconds(m.tpot.predict(pd.tpotX)))
		pd.idleTPOT = seconds(max(0, m.tpot.predict(tpotFeatures(0, 0))))
	}
	pd.CostUSD = c.speed.CostPerHour / 3600 * (uncached/speed + outTokens*decodeShare(c))
	c.pred = pd
	return ahead
}

// predictPrefill predicts a split request's prefill leg (one output token) on each of cands, replicas of
// prefill-only pools, as predictAll predicts a whole request, without touching the model's trust or pressure:
// those judge whole requests.
func (p *predictor) predictPrefill(cands []scored, pr *prompt, objective float64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	z := tailZ(objective)
	for i := range cands {
		p.predictLocked(&cands[i], pr, 1, z, now)
	}
}

// anyIdleWithin says whether some candidate (predicted by predictAll) would give its request a TTFT within
// limit × margin with nothing queued or running — the margin scaled by the candidate's calibration factor when
// calibrated, as meets judges it: whether waiting for room can ever bring the request within its target.
func anyIdleWithin(cands []scored, limit time.Duration, margin float64, calibrated bool) bool {
	for i := range cands {
		c := &cands[i]
		m := margin
		if calibrated {
			m = min(1, margin*c.pred.factor)
		}
		if c.pred.idle <= time.Duration(float64(limit)*m) {
			return true
		}
	}
	return false
}

// anyIdleDecodesWithin says whether some candidate (predicted by predictAll) would decode its request within
// limit alone in its batch: whether a request predicted to decode late everywhere is late for the batches it
// would join, not for a TPOT target no endpoint of the model can meet.
func anyIdleDecodesWithin(cands []scored, limit time.Duration) bool {
	for i := range cands {
		if c := &cands[i]; c.pred.idleTPOT > 0 && c.pred.idleTPOT <= limit {
			return true
		}
	}
	return false
}

// decodeShare is the GPU seconds per output token a request is charged on a candidate: its share of the
// engine's decode steps. A step takes about as long for one sequence as for a full batch (decoding is bound by
// reading the weights), so a replica whose batch has room serves the next request's tokens almost for free,
// and one that is idle spends whole steps on it alone: with the pool's batch size S and the batch the request
// would join b (the engine's running and waiting plus this gateway's sends since, itself included, at most S),
// each token costs S ÷ b of its full-batch share, 1 ÷ the decode speed. Ranking by it fills a replica before
// waking another, so that a fleet below its capacity leaves replicas idle (scaled down, or free for other
// work) instead of running every replica at a partial batch; the class price still ranks replicas whose
// batches are alike. Without a batch size every replica is charged the full-batch share.
func decodeShare(c *scored) float64 {
	full := 1 / max(c.speed.DecodeTokensPerSecond, 1)
	slots := float64(c.pool.MaxConcurrency)
	if slots <= 0 {
		return full
	}
	batch := min(slots, max(1, c.running+float64(c.queue)+c.since+1))
	return full * slots / batch
}

// sent records a request sent to ep (at pd.sentAt), for ū, the prefill ahead of the next ones (aheadTokens) and
// the prefill share (prefillShare), and the decision in its model's pressure and sacrifices (see noteDecision).
func (p *predictor) sent(ep string, pd Prediction, model string, busy, sacrificed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteDecisionLocked(model, busy, sacrificed)
	m := p.model(ep, 0, 0, 0)
	m.remember(sentPrompt{at: pd.sentAt, firstBy: pd.sentAt.Add(pd.TTFT + pd.tail), uncached: pd.uncached})
	if m.uncached == 0 {
		m.uncached = max(pd.uncached, 1)
	} else {
		m.uncached += uncachedWeight * (pd.uncached - m.uncached)
	}
}

// sentPrefill records a split request's prefill leg among its prefiller's sends, in the prefill ahead and the
// prefill share, as sent does a whole request's (the decision itself was counted at its decoder).
func (p *predictor) sentPrefill(ep string, pd Prediction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.model(ep, 0, 0, 0)
	m.remember(sentPrompt{at: pd.sentAt, firstBy: pd.sentAt.Add(pd.TTFT + pd.tail), uncached: pd.uncached})
}

// observe fits an endpoint's model to one request's measured timing (tpot 0: not measured), and forgets it
// among the sends still in prefill: it has its first token, whenever that was due.
func (p *predictor) observe(ep string, pd Prediction, ttft, tpot time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.model(ep, 0, 0, 0)
	m.forgetSend(pd)
	if ttft > 0 {
		if m.ttftSeen == settledObservations {
			m.residuals = 0 // the spread starts again from the settled fit's residuals (see Judging at the tail)
		}
		m.noteResidual(ttft.Seconds() - m.ttft.predict(pd.ttftX))
		m.ttft.observe(pd.ttftX, ttft.Seconds())
		m.ttftSeen++
	}
	if tpot > 0 {
		m.tpot.observe(pd.tpotX, tpot.Seconds())
		m.tpotSeen++
	}
}

// managedTTFT is the TTFT the picker expects of a managed fallback: the mean of its observed TTFTs (the
// provider's own queue is not visible), 0 until one was observed.
func (p *predictor) managedTTFT(cluster string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.eps[cluster]
	if m == nil || m.ttft.n == 0 {
		return 0
	}
	return seconds(max(0, m.ttft.predict([fitDims]float64{1})))
}

func (p *predictor) observeManaged(cluster string, ttft time.Duration) {
	if ttft <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.eps[cluster]
	if m == nil {
		if p.eps == nil {
			p.eps = map[string]*endpointModel{}
		}
		m = &endpointModel{ttft: newFit(ttft.Seconds())}
		p.eps[cluster] = m
	}
	m.ttft.observe([fitDims]float64{1}, ttft.Seconds())
}

// forget drops the models of endpoints keep rejects.
func (p *predictor) forget(keep func(string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ep := range p.eps {
		if !keep(ep) {
			delete(p.eps, ep)
		}
	}
}

func seconds(s float64) time.Duration {
	if math.IsNaN(s) || s > 1e6 {
		return time.Duration(1e6 * float64(time.Second))
	}
	return time.Duration(s * float64(time.Second))
}
