package picker

import (
	"math"
	"sync"
	"time"

	"github.com/infergate/infergate/openai"
)

// DefaultChurnEvery is how often a replica reports its churn: often enough that the others' indexes age with
// the engine's cache to within a tenth of a second, and few enough messages that they do not grow with the
// request rate (one per endpoint written to, per report).
const DefaultChurnEvery = 100 * time.Millisecond

// churn adds up, per endpoint, the blocks this replica's requests added to the cache and no placement
// carried, until the next report. Reports go out from the request path, when one is due: the picker has no
// goroutine of its own, and an idle replica has nothing to report.
type churn struct {
	mu     sync.Mutex
	blocks map[string]int
	last   time.Time
	now    func() time.Time // tests' clock; nil: time.Now
}

// churnBasis is what a decision leaves for Observe to count its churn with.
type churnBasis struct {
	blockTokens float64 // the engine's tokens per index block (the hashing block over the token scale)
	carried     int     // blocks new to the index that a placement published at the decision carried
	added       int     // blocks new to the index beyond those: the count when the engine reports no cache use
}

// observeChurn counts what a finished request added to its endpoint's cache, beyond what a placement carried:
// the prompt's tokens the engine did not serve from its cache (cached_tokens), in index blocks. The engine's
// own figure, not the index's: a replica whose index had aged a group out that the engine still held would
// otherwise report those blocks as new, and the others' indexes would age faster than the engine's cache. An
// engine that reports no cache use leaves the index's count. Nothing is counted while prompts do not come back
// (the sharing estimate), as nothing is published then.
func (p *Affinity) observeChurn(d Decision, u openai.Usage) {
	if p.Placements == nil || p.ChurnEvery < 0 || len(d.Endpoints) == 0 || d.churn.blockTokens <= 0 {
		return
	}
	if b := p.sharing.Load(); b != 0 && math.Float64frombits(b) < consistentPlacement {
		return // prompts do not come back: nothing the indexes hold is worth ageing in step, or a message
	}
	ep := d.Endpoints[0]
	if d.ServedBy != "" {
		ep = d.ServedBy
	}
	blocks := d.churn.added
	if u.CachedReported && u.PromptTokens > 0 {
		uncached := max(0, u.PromptTokens-max(0, u.CachedTokens))
		blocks = max(0, int(min(float64(uncached)/d.churn.blockTokens, MaxLearntCapacity))-d.churn.carried)
	}
	p.noteChurn(ep, blocks)
}

// noteChurn (for observeChurn, which checks that reports are wanted) counts blocks added to endpoint and, when
// a report is due, publishes the blocks per endpoint since the last.
func (p *Affinity) noteChurn(endpoint string, blocks int) {
	every := p.ChurnEvery
	if every == 0 {
		every = DefaultChurnEvery
	}
	c := &p.churn
	now := p.now() // the picker's clock, simulated in the benches
	if c.now != nil {
		now = c.now()
	}
	c.mu.Lock()
	if blocks > 0 {
		if c.blocks == nil {
			c.blocks = map[string]int{}
		}
		c.blocks[endpoint] += blocks
	}
	if c.last.IsZero() {
		c.last = now // the first report covers a whole interval too
	}
	if now.Sub(c.last) < every || len(c.blocks) == 0 {
		c.mu.Unlock()
		return
	}
	c.last = now
	due := c.blocks
	c.blocks = make(map[string]int, len(due))
	c.mu.Unlock()
	if cp, ok := p.Placements.(ChurnPublisher); ok {
		cp.PublishChurn(due)
		return
	}
	for ep, n := range due {
		p.Placements.Publish(Placement{Endpoint: ep, Churn: n})
	}
}

// ChurnPublisher is a Placements that sends a whole churn report at once (the placements package: one
// message for many endpoints). It owns the map it is given.
type ChurnPublisher interface {
	PublishChurn(blocks map[string]int)
}
