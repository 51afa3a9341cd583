// Package scorers is the picker's table of scorers: each one a name (its key under the policy's
// routing.weights), a default weight and a normalised score of one candidate endpoint for one request. The
// policy's defaults and validation, the picker's scoring loop and the routing.debugScores header all read this
// one table, so a new scorer is one entry here, one weight name and one golden row.
package scorers

// Candidate is what a scorer may read of one endpoint for one request: the picker fills it from its prefix
// index, the engine's metrics and the pool's hardware before scoring.
type Candidate struct {
	// PromptBlocks is how many blocks of the prompt were hashed (0: no prompt); MatchedBlocks how many of its
	// leading blocks the endpoint holds in the picker's index.
	PromptBlocks, MatchedBlocks int
	// Load is the endpoint's requests in flight plus its engine's queue; MaxLoad the most any candidate has.
	Load, MaxLoad int64
	// UncachedTokens is how many of the prompt's tokens (in the engine's tokens) the endpoint would prefill.
	UncachedTokens float64
	// PrefillTokensPerSecond is the pool's prefill speed for the model (0: unknown).
	PrefillTokensPerSecond float64
	// AdapterLoaded says the engine reports the requested LoRA adapter loaded.
	AdapterLoaded bool
}

// Scorer is one entry of the table.
type Scorer struct {
	// Name is the scorer's key under routing.weights and in the x-infergate-scores header.
	Name string
	// DefaultWeight is its weight when the policy does not state one.
	DefaultWeight float64
	// Fit marks a score that says how well the endpoint's hardware suits the prompt, whatever its cache and
	// load: a prefix no endpoint holds starts on the best fit first (see picker's placeNew).
	Fit bool
	// Score is the candidate's score, in [0,1]. The candidate is passed by value: through a function value a
	// pointer would make every candidate escape to the heap.
	Score func(Candidate) float64
}

// Max is the most scorers a table may hold: the picker keeps every candidate's scores in a fixed array, so that
// scoring allocates nothing.
const Max = 8

// PrefillTau is the prefill scorer's scale: a prompt whose uncached part takes τ to prefill scores 0.5.
const PrefillTau = 0.25 // seconds

// Default is the table infergate runs.
var Default = []Scorer{
	{Name: "prefix", DefaultWeight: 2, Score: Prefix},
	{Name: "load", DefaultWeight: 1, Score: Load},
	{Name: "prefill", DefaultWeight: 1, Fit: true, Score: Prefill},
	{Name: "lora", DefaultWeight: 1, Fit: true, Score: LoRA},
}

// Prefix is the share of the prompt's leading blocks the endpoint holds: a held prefix is prefill not done.
func Prefix(c Candidate) float64 {
	if c.PromptBlocks <= 0 {
		return 0
	}
	return float64(c.MatchedBlocks) / float64(c.PromptBlocks)
}

// Load is 1 for an idle endpoint, falling toward 0 for the busiest candidate: load spreads requests before any
// engine queues.
func Load(c Candidate) float64 {
	return 1 - float64(c.Load)/float64(c.MaxLoad+1)
}

// Prefill is τ/(t+τ) for t the seconds the endpoint's hardware needs for the prompt's uncached tokens: long
// uncached prompts prefer the class that prefills fastest.
func Prefill(c Candidate) float64 {
	if c.PrefillTokensPerSecond <= 0 {
		return 0
	}
	t := max(0, c.UncachedTokens) / c.PrefillTokensPerSecond
	return PrefillTau / (t + PrefillTau)
}

// LoRA is 1 where the requested adapter is already loaded: loading one costs the engine seconds.
func LoRA(c Candidate) float64 {
	if c.AdapterLoaded {
		return 1
	}
	return 0
}

// Names lists a table's scorer names in order.
func Names(table []Scorer) []string {
	out := make([]string, len(table))
	for i, s := range table {
		out[i] = s.Name
	}
	return out
}

// Known says whether name is a scorer of the default table.
func Known(name string) bool {
	for _, s := range Default {
		if s.Name == name {
			return true
		}
	}
	return false
}
