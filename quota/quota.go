// Package quota enforces tenants' limits — requests per second, tokens per minute, concurrent requests,
// monthly spend and per-conversation tokens — across every gateway replica. Admission reserves an estimate
// atomically in Redis (one Lua script, one round trip), or in process from a lease this gateway reserved in
// Redis ahead of time (no round trip); the response path settles the real usage in batches, refunding or
// charging the difference. When Redis is down the policy decides: fail open on an in-process
// limiter at limit ÷ replicas, or fail closed with 503.
package quota

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/infergate/infergate/policies"
)

// Limit kinds.
const (
	KindRequests     = "rps"
	KindTokens       = "tpm"
	KindConcurrency  = "conc"
	KindSpend        = "spend"
	KindConversation = "conv"
)

// Request is what admission needs to know about one request.
type Request struct {
	Snapshot *policies.Snapshot
	Tenant   *policies.Tenant
	Model    *policies.Model
	// EstimatedTokens is prompt tokens (estimated from the body) plus max_tokens or the policy default.
	EstimatedTokens int64
	// EstimatedCostMicros is the estimate's price in micro-USD.
	EstimatedCostMicros int64
	// Conversation is the value of the policy's conversation header, if any.
	Conversation string
	Now          time.Time
}

// entry is one limit checked at admission: a counter in Redis (or locally) with its limit.
type entry struct {
	kind   string
	scope  string // "tenant" or the model name
	key    string
	limit  int64
	amount int64
	window time.Duration // 0: no rolling window (concurrency); spend and conversation keys expire after it

	// Lease bookkeeping (lease.go): covered means this gateway's lease paid the amount, so Redis is sent 0;
	// extra is the lease top-up asked of Redis; member and memberExp name the concurrency slot held.
	covered   bool
	extra     int64
	member    string
	memberExp time.Time
}

// sent is the amount the admission script must reserve for this entry.
func (e *entry) sent() int64 {
	if e.covered {
		return 0
	}
	return e.amount
}

// Ticket is an admitted request's reservation, needed to settle it.
type Ticket struct {
	ID      string
	Tenant  string
	entries []entry
	local   bool
	at      time.Time // admission time
	est     int64     // tokens reserved
	estCost int64     // micro-USD reserved
	// budgets is what is left of the tenant's request and token limits after this admission: at most those
	// two, held in place so that admission allocates nothing for them.
	budgets  [2]Budget
	nBudgets int

	// refill marks a lease top-up's ticket (no admission marker); marked, a ticket admitted through Redis,
	// whose settlement deletes its marker. lostSent is what an admission whose reply was lost had sent per
	// entry, and ambiguous that it may have run: the ticket is then resolved (resolveScript), not replayed.
	refill, marked, ambiguous bool
	lostSent                  []int64
}

// Rejection says which limit refused a request.
type Rejection struct {
	Kind      string
	Scope     string
	Limit     int64
	Used      int64
	Requested int64
	Reset     time.Duration
}

// ConcurrencyTTL is how long a concurrency slot survives without renewal: the gateway renews the slots of
// requests in flight (renew.go), so a crashed gateway's requests stop counting this long after it died.
const ConcurrencyTTL = 10 * time.Second

// MicroUSD prices tokens at a model's policy prices, saturating at the largest int64 rather than wrapping:
// token counts come from clients and engines.
func MicroUSD(m *policies.Model, prompt, completion int64) int64 {
	v := math.Round(priceMicros(m, prompt, completion))
	if v >= math.MaxInt64 || math.IsNaN(v) {
		return math.MaxInt64
	}
	return int64(v)
}

// CostUSD prices tokens at a model's policy prices, in dollars (the spend metrics' unit).
func CostUSD(m *policies.Model, prompt, completion int64) float64 {
	return priceMicros(m, prompt, completion) / 1e6
}

// priceMicros is the one price formula: tokens × USD per million tokens = micro-USD.
func priceMicros(m *policies.Model, prompt, completion int64) float64 {
	return float64(max(prompt, 0))*m.Pricing.InputPerMTok + float64(max(completion, 0))*m.Pricing.OutputPerMTok
}

// AddTokens adds two non-negative token counts, saturating at the largest int64: an estimate built from a
// client's max_tokens must never wrap negative and slip under a limit.
// MulTokens multiplies token counts (an output bound by its sequences), saturating at the int64 limit.
func MulTokens(a, n int64) int64 {
	if a > 0 && n > 0 && a > math.MaxInt64/n {
		return math.MaxInt64
	}
	return a * n
}

func AddTokens(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// tag keeps every key of a tenant in one Redis Cluster slot.
func tag(tenant string) string {
	if strings.ContainsAny(tenant, "{}") {
		tenant = braces.Replace(tenant)
	}
	return "{" + tenant + "}"
}

var braces = strings.NewReplacer("{", "_", "}", "_")

// entriesFor lists the limits that apply to a request, tenant-wide first.
func entriesFor(r Request) []entry {
	var out []entry
	t := tag(r.Tenant.Name)
	add := func(scope string, q policies.Quota) {
		prefix := "ig:" + t + ":" + scope
		if q.RequestsPerSecond > 0 {
			window, limit := rpsWindow(q.RequestsPerSecond)
			out = append(out, entry{kind: KindRequests, scope: scope, limit: limit, amount: 1, window: window,
				key: prefix + ":rps:" + windowID(r.Now, window)})
		}
		if q.TokensPerMinute > 0 {
			out = append(out, entry{kind: KindTokens, scope: scope, limit: q.TokensPerMinute, amount: r.EstimatedTokens,
				window: time.Minute, key: prefix + ":tpm:" + windowID(r.Now, time.Minute)})
		}
		if q.MaxConcurrent > 0 {
			out = append(out, entry{kind: KindConcurrency, scope: scope, limit: int64(q.MaxConcurrent), amount: 1,
				key: prefix + ":conc"})
		}
		if q.MonthlySpendUSD > 0 {
			month := r.Now.UTC().Format("200601")
			out = append(out, entry{kind: KindSpend, scope: scope, limit: int64(q.MonthlySpendUSD * 1e6), amount: r.EstimatedCostMicros,
				window: 40 * 24 * time.Hour, key: prefix + ":spend:" + month})
		}
		if q.ConversationTokens > 0 && r.Conversation != "" {
			sum := sha256.Sum256([]byte(r.Conversation))
			out = append(out, entry{kind: KindConversation, scope: scope, limit: q.ConversationTokens, amount: r.EstimatedTokens,
				window: 24 * time.Hour, key: prefix + ":conv:" + hex.EncodeToString(sum[:8])})
		}
	}
	add("tenant", r.Tenant.Quota)
	if q, ok := r.Snapshot.ModelQuota(r.Tenant, r.Model); ok {
		add("model:"+r.Model.Name, q)
	}
	return out
}

// rpsWindow turns a requests-per-second limit into a fixed window and a count: whole seconds, the shortest
// (up to 10 s) in which the rate is a whole number of requests, so 2.5/s is 5 per 2 s rather than 2 per
// second; a rate below 1/s is one request per ⌈1/rate⌉ seconds.
func rpsWindow(rps float64) (time.Duration, int64) {
	if rps < 1 {
		return time.Duration(math.Ceil(1/rps)) * time.Second, 1
	}
	for k := 1; k <= 10; k++ {
		if n := rps * float64(k); math.Abs(n-math.Round(n)) < 1e-9 {
			return time.Duration(k) * time.Second, int64(math.Round(n))
		}
	}
	return time.Second, int64(math.Floor(rps))
}

func windowID(now time.Time, window time.Duration) string {
	return strconv.FormatInt(now.UnixMilli()/window.Milliseconds(), 10)
}

// settleDeltas returns, per entry, the correction to apply when the real usage is known: what the request used
// less what was reserved (none for a concurrency slot, which is freed instead).
func settleDeltas(t *Ticket, tokens, costMicros int64) []int64 {
	out := make([]int64, len(t.entries))
	for i := range t.entries {
		if e := &t.entries[i]; e.kind != KindConcurrency {
			out[i] = e.use(tokens, costMicros) - e.amount
		}
	}
	return out
}

// use is what a finished request really used of the entry: its tokens, its cost, the one request it was (as
// reserved); nothing of a concurrency slot.
func (e *entry) use(tokens, costMicros int64) int64 {
	switch e.kind {
	case KindTokens, KindConversation:
		return tokens
	case KindSpend:
		return costMicros
	case KindRequests:
		return e.amount
	}
	return 0
}

// Error says which limit refused the request: a Rejection is the quota stage's neutral error.
func (r *Rejection) Error() string {
	return fmt.Sprintf("%s limit of %s: limit %d, used %d, requested %d", r.Kind, r.Scope, r.Limit, r.Used, r.Requested)
}
