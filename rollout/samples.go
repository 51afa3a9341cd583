// Package rollout releases a model's candidate in steps: it samples the candidate's and the baseline's
// requests over the same span from the gateway's own settlements, tests them against the policy's gates and
// moves the rollout's state — advance, hold, roll back — which the director reads as the candidate's share of
// traffic.
package rollout

import (
	"math"
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
	// TTFT and TPOT are log seconds of a uniform sample of the requests (TTFT of streamed ones only).
	TTFT []float64 `json:"ttft,omitempty"`
	TPOT []float64 `json:"tpot,omitempty"`
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
	a.TTFT, a.TPOT, a.Output = append(a.TTFT, b.TTFT...), append(a.TPOT, b.TPOT...), append(a.Output, b.Output...)
}

// referencePoints is how many latency points a stored baseline reference keeps per metric.
const referencePoints = 256

// reference thins an arm to a reference small enough to share through the state store: its counts and
// evenly spaced order statistics of each latency. A test against it uses referencePoints as the baseline's
// sample size, which only widens its variance.
func (a Arm) reference() Arm {
	thin := func(v []float64) []float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v) <= referencePoints {
			return v
		}
		out := make([]float64, referencePoints)
		for i := range out {
			out[i] = v[(2*i+1)*len(v)/(2*referencePoints)]
		}
		return out
	}
	return Arm{Requests: a.Requests, Good: a.Good, Errors: a.Errors, Finished: a.Finished, Unfinished: a.Unfinished,
		TTFT: thin(a.TTFT), TPOT: thin(a.TPOT), Output: thin(a.Output)}
}

func (a Arm) equal(b Arm) bool {
	return a.Requests == b.Requests && a.Good == b.Good && a.Errors == b.Errors && a.Finished == b.Finished &&
		a.Unfinished == b.Unfinished && slices.Equal(a.TTFT, b.TTFT) && slices.Equal(a.TPOT, b.TPOT) &&
		slices.Equal(a.Output, b.Output)
}

// reservoir keeps a uniform sample of at most maxSamples values (Vitter's algorithm R).
type reservoir struct {
	seen int
	vals []float64
	rng  uint64
}

func (r *reservoir) add(v float64) {
	r.seen++
	if len(r.vals) < maxSamples {
		r.vals = append(r.vals, v)
		return
	}
	r.rng ^= r.rng << 13 // xorshift64: the reservoir's choice need not be unpredictable, only uniform
	r.rng ^= r.rng >> 7
	r.rng ^= r.rng << 17
	if j := r.rng % uint64(r.seen); j < maxSamples {
		r.vals[j] = v
	}
}

// classArm is one arm's requests on one hardware class.
type classArm struct {
	requests, good, errors int
	finished, unfinished   int
	ttft, tpot, output     reservoir
}

func (c *classArm) arm() Arm {
	return Arm{Requests: c.requests, Good: c.good, Errors: c.errors, Finished: c.finished, Unfinished: c.unfinished, TTFT: slices.Clone(c.ttft.vals), TPOT: slices.Clone(c.tpot.vals),
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
	if st.Timing.TTFT > 0 && st.Timing.Chunked {
		c.ttft.add(math.Log(st.Timing.TTFT.Seconds()))
	}
	if st.Timing.TPOT > 0 {
		c.tpot.add(math.Log(st.Timing.TPOT.Seconds()))
	}
	if n := st.Usage.CompletionTokens; n > 0 && st.Outcome == director.OutcomeOK {
		c.output.add(math.Log(float64(n)))
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
