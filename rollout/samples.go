// Package rollout releases a model's candidate in steps: it samples the candidate's and the baseline's
// requests over the same span from the gateway's own settlements, tests them against the policy's gates and
// moves the rollout's state — advance, hold, roll back — which the director reads as the candidate's share of
// traffic.
package rollout

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/infergate/infergate/director"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
)

// maxSamples bounds each arm's latency samples per hardware class and metric: past it a uniform reservoir
// keeps that many (a test on 4,096 of each arm already tells 5 % from 0 %).
const maxSamples = 4096

// Arm is one arm's requests of the current step, as the gates test them.
type Arm struct {
	Requests int `json:"requests"`
	Good     int `json:"good"`
	Errors   int `json:"errors"`
	// Finished counts the answers whose finish reason the gateway saw; Unfinished those of them that did not
	// end on their own (cut at max tokens, filtered, aborted: not stop or tool_calls).
	Finished   int `json:"finished,omitempty"`
	Unfinished int `json:"unfinished,omitempty"`
	// TTFT and TPOT are log seconds of a uniform sample of the requests (TTFT of streamed ones only);
	// TTFTLoad and TPOTLoad are each sample's load stratum (loadStratum), by which the gates compare the arms
	// at the same load. A reference saved before they existed has none, and is compared unstratified.
	TTFT     []float64 `json:"ttft,omitempty"`
	TPOT     []float64 `json:"tpot,omitempty"`
	TTFTLoad []uint16  `json:"ttftLoad,omitempty"`
	TPOTLoad []uint16  `json:"tpotLoad,omitempty"`
	// Output is the log of the output tokens of a uniform sample of the requests that generated any.
	Output []float64 `json:"output,omitempty"`
}

// GoodRatio is the share of requests that met their SLO.
func (a Arm) GoodRatio() float64 { return ratio(a.Good, a.Requests) }

// UnfinishedRate is the share of answers with a finish reason that did not end on their own.
func (a Arm) UnfinishedRate() float64 { return ratio(a.Unfinished, a.Finished) }

// ErrorRate is the share of requests that failed on the serving side (5xx, resets, timeouts).
func (a Arm) ErrorRate() float64 { return ratio(a.Errors, a.Requests) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (a *Arm) merge(b *Arm) {
	a.Requests, a.Good, a.Errors = a.Requests+b.Requests, a.Good+b.Good, a.Errors+b.Errors
	a.Finished, a.Unfinished = a.Finished+b.Finished, a.Unfinished+b.Unfinished
	a.TTFTLoad, a.TPOTLoad = appendStrata(a.TTFTLoad, len(a.TTFT), b.TTFTLoad, len(b.TTFT)), appendStrata(a.TPOTLoad, len(a.TPOT), b.TPOTLoad, len(b.TPOT))
	a.TTFT, a.TPOT, a.Output = append(a.TTFT, b.TTFT...), append(a.TPOT, b.TPOT...), append(a.Output, b.Output...)
}

// appendStrata joins two samples' strata, which stay parallel to their values only when both have them.
func appendStrata(a []uint16, na int, b []uint16, nb int) []uint16 {
	if len(a) != na || len(b) != nb {
		return nil
	}
	return append(a, b...)
}

// referencePoints is how many latency points a stored baseline reference keeps per metric.
const referencePoints = 256

// reference thins an arm to a reference small enough to share through the state store: its counts and
// evenly spaced order statistics of each latency. A test against it uses referencePoints as the baseline's
// sample size, which only widens its variance.
func (a Arm) reference() Arm {
	ref := Arm{Requests: a.Requests, Good: a.Good, Errors: a.Errors, Finished: a.Finished, Unfinished: a.Unfinished}
	ref.TTFT, ref.TTFTLoad = thin(a.TTFT, a.TTFTLoad)
	ref.TPOT, ref.TPOTLoad = thin(a.TPOT, a.TPOTLoad)
	ref.Output, _ = thin(a.Output, nil)
	return ref
}

// thin keeps referencePoints evenly spaced order statistics of a sample, each with its stratum when the sample
// has them.
func thin(v []float64, strata []uint16) ([]float64, []uint16) {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(i, j int) int { return cmp.Compare(v[i], v[j]) })
	if len(idx) > referencePoints {
		kept := make([]int, referencePoints)
		for i := range kept {
			kept[i] = idx[(2*i+1)*len(idx)/(2*referencePoints)]
		}
		idx = kept
	}
	vals := make([]float64, len(idx))
	var out []uint16
	if len(strata) == len(v) && len(v) > 0 {
		out = make([]uint16, len(idx))
	}
	for k, i := range idx {
		vals[k] = v[i]
		if out != nil {
			out[k] = strata[i]
		}
	}
	return vals, out
}

func (a Arm) equal(b Arm) bool {
	return a.Requests == b.Requests && a.Good == b.Good && a.Errors == b.Errors && a.Finished == b.Finished &&
		a.Unfinished == b.Unfinished && slices.Equal(a.TTFT, b.TTFT) && slices.Equal(a.TPOT, b.TPOT) &&
		slices.Equal(a.Output, b.Output) && slices.Equal(a.TTFTLoad, b.TTFTLoad) && slices.Equal(a.TPOTLoad, b.TPOTLoad)
}

// reservoir keeps a uniform sample of at most maxSamples values, each with its load stratum (Vitter's
// algorithm R).
type reservoir struct {
	seen   int
	vals   []float64
	strata []uint16
	rng    uint64
}

func (r *reservoir) add(v float64, stratum uint16) {
	r.seen++
	if len(r.vals) < maxSamples {
		r.vals, r.strata = append(r.vals, v), append(r.strata, stratum)
		return
	}
	r.rng ^= r.rng << 13 // xorshift64: the reservoir's choice need not be unpredictable, only uniform
	r.rng ^= r.rng >> 7
	r.rng ^= r.rng << 17
	if j := r.rng % uint64(r.seen); j < maxSamples {
		r.vals[j], r.strata[j] = v, stratum
	}
}

// loadStrata is how many load strata the gates tell apart: 0, 1, 2-3, 4-7, … and 64 or more requests in
// flight at the endpoint when the request was placed.
const loadStrata = 8

// loadStratum is a load's stratum: a doubling of the requests in flight changes an engine's batch, and so its
// latency, about as much at any size.
func loadStratum(load int64) uint16 {
	return uint16(min(bits.Len64(uint64(max(load, 0))), loadStrata-1))
}

// classArm is one arm's requests on one hardware class.
type classArm struct {
	requests, good, errors int
	finished, unfinished   int
	ttft, tpot, output     reservoir
}

func (c *classArm) arm() Arm {
	return Arm{Requests: c.requests, Good: c.good, Errors: c.errors, Finished: c.finished, Unfinished: c.unfinished, TTFT: slices.Clone(c.ttft.vals), TPOT: slices.Clone(c.tpot.vals),
		TTFTLoad: slices.Clone(c.ttft.strata), TPOTLoad: slices.Clone(c.tpot.strata),
		Output: slices.Clone(c.output.vals)}
}

// modelSamples are one model's two arms since its step's judging began.
type modelSamples struct {
	from  time.Time
	arms  [2]map[string]*classArm // candidate, baseline; by hardware class
	count int                     // candidate requests since the last TakeCount
}

// Samples collects every rolled-out model's arms since its current step's judging began: a settle observer.
type Samples struct {
	mu     sync.Mutex
	models map[string]*modelSamples
}

// NewSamples returns an empty collection.
func NewSamples() *Samples { return &Samples{models: map[string]*modelSamples{}} }

func (s *Samples) model(name string) *modelSamples {
	m := s.models[name]
	if m == nil {
		m = &modelSamples{arms: [2]map[string]*classArm{{}, {}}}
		s.models[name] = m
	}
	return m
}

// judgeFrom starts a model's samples afresh from t (a new step, or the end of the candidate's warm-up):
// requests started before t are not judged. The same t again keeps what was collected.
func (s *Samples) judgeFrom(model string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.model(model)
	if !m.from.Equal(t) {
		m.from, m.arms = t, [2]map[string]*classArm{{}, {}}
	}
}

// Settled implements director.SettleObserver: a routed request of a rollout arm counts, unless a tester chose
// its arm, it failed by the tenant's doing (client errors, quotas) or it went to a managed API.
func (s *Samples) Settled(st director.Settlement) {
	if !st.Routed || st.Arm == "" || st.ArmChosen || st.HardwareClass == director.ManagedClass ||
		st.Outcome == director.OutcomeClientError || st.Outcome == director.OutcomeQuota {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.model(st.Model)
	i := 1
	if st.Arm == picker.ArmCandidate {
		i = 0
		m.count++
	}
	if !st.Started.IsZero() && st.Started.Before(m.from) {
		return
	}
	c := m.arms[i][st.HardwareClass]
	if c == nil {
		c = &classArm{ttft: reservoir{rng: 0x9e3779b97f4a7c15}, tpot: reservoir{rng: 0xbf58476d1ce4e5b9},
			output: reservoir{rng: 0x94d049bb133111eb}}
		m.arms[i][st.HardwareClass] = c
	}
	c.requests++
	if st.Good {
		c.good++
	}
	switch st.Outcome {
	case director.OutcomeUpstream5xx, director.OutcomeReset, director.OutcomeTimeout:
		c.errors++
	}
	stratum := loadStratum(st.Load)
	if st.Timing.TTFT > 0 && st.Timing.Chunked {
		c.ttft.add(math.Log(st.Timing.TTFT.Seconds()), stratum)
	}
	if st.Timing.TPOT > 0 {
		c.tpot.add(math.Log(st.Timing.TPOT.Seconds()), stratum)
	}
	if n := st.Usage.CompletionTokens; n > 0 && st.Outcome == director.OutcomeOK {
		c.output.add(math.Log(float64(n)), 0) // how much a model says does not depend on the load
	}
	if st.FinishReason != "" && st.Outcome == director.OutcomeOK {
		c.finished++
		if st.FinishReason != openai.FinishStop && st.FinishReason != openai.FinishToolCalls {
			c.unfinished++
		}
	}
}

// Arms returns a model's candidate and baseline since its step's judging began. The baseline is taken from
// the candidate's hardware classes when it has at least minRequests there, so that a candidate on H100s is
// not judged against L40S latencies; otherwise from every class.
func (s *Samples) Arms(model string, minRequests int) (candidate, baseline Arm) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[model]
	if m == nil {
		return Arm{}, Arm{}
	}
	var same, all Arm
	for _, class := range sortedKeys(m.arms[0]) {
		a := m.arms[0][class].arm()
		candidate.merge(&a)
	}
	for _, class := range sortedKeys(m.arms[1]) {
		b := m.arms[1][class].arm()
		if m.arms[0][class] != nil {
			same.merge(&b)
		}
		all.merge(&b)
	}
	if same.Requests >= minRequests {
		return candidate, same
	}
	return candidate, all
}

// reset forgets a model's requests: a new run of its rollout judges only its own.
func (s *Samples) reset(model string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.models, model)
}

// TakeCount returns the candidate requests of a model since the last call, for a step's request count.
func (s *Samples) TakeCount(model string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[model]
	if m == nil {
		return 0
	}
	n := m.count
	m.count = 0
	return n
}
