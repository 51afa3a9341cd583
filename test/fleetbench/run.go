package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/loadgen"
)

// timeScale is real seconds per simulated second (flag -timescale).
var timeScale = 1.0

type request struct {
	model        string
	system, user string
	maxTokens    int
	at           time.Duration // simulated offset from the run's start
}

type outcome struct {
	ok, managed, good bool
	ttft, tpot        time.Duration // simulated; the TTFT from the request's arrival at the gateway
	waited            time.Duration // of the TTFT, in the gateway's admission queue
	prompt, cached    int64
	completion        int64
	predicted         time.Duration // SLO placement's predicted TTFT, for self-hosted requests
	endpoint          string
}

// destination is where a router sends a request: a replica, or a model's managed API.
type destination struct {
	endpoint  string
	managed   bool
	predicted time.Duration // the picker's predicted TTFT, when it predicts
	waited    time.Duration // simulated time the request waited in the gateway before it was sent
	// firstToken, when set, tells the picker the request's first token came (picker.Picker.Prefilled).
	firstToken func()
}

type router interface {
	pick(r *request) (destination, func(outcome))
}

type roundRobin struct {
	eps map[string][]string
	n   sync.Map // model → *atomic.Uint64
}

func (rr *roundRobin) pick(r *request) (destination, func(outcome)) {
	c, _ := rr.n.LoadOrStore(r.model, &atomic.Uint64{})
	eps := rr.eps[r.model]
	return destination{endpoint: eps[int(c.(*atomic.Uint64).Add(1))%len(eps)]}, func(outcome) {}
}

// pickerRouter adapts an infergate picker with in-flight accounting and, like the director, hands it what the
// engine reported and what the client measured.
type pickerRouter struct {
	snap     *policies.Snapshot
	picker   picker.Picker
	inflight *fleet.InFlight
}

func (p *pickerRouter) pick(r *request) (destination, func(outcome)) {
	req := parsed(r)
	defer req.Release()
	d, err := p.decide(r, &req, picker.Input{})
	if err != nil {
		return destination{}, func(outcome) {}
	}
	p.inflight.Start(d.Target(r.model))
	return p.sent(r, d, 0)
}

// parsed is a request's body as the gateway parses it; the caller releases it.
func parsed(r *request) openai.Request {
	req, err := openai.ParseRequest(openai.EndpointChat, chatBody(r, r.model))
	if err != nil {
		log.Fatal(err)
	}
	return req
}

// tenant is the benchmark policy's one tenant.
func (p *pickerRouter) tenant() *policies.Tenant { return &p.snap.Policy.Spec.Tenants[0] }

// decide asks the picker for a parsed request, with in's queueing and time waited.
func (p *pickerRouter) decide(r *request, req *openai.Request, in picker.Input) (picker.Decision, error) {
	in.Model, _ = p.snap.Model(r.model)
	in.Tenant, in.Request = p.tenant(), req
	return p.picker.Pick(p.snap, in)
}

// sent is the destination of a decision counted in flight, and what to do when its request ends.
func (p *pickerRouter) sent(r *request, d picker.Decision, waited time.Duration) (destination, func(outcome)) {
	target := d.Target(r.model)
	dest := destination{endpoint: target, managed: d.Fallback != nil, predicted: d.Predicted.TTFT, waited: waited}
	if d.Fallback == nil {
		dest.endpoint, dest.firstToken = d.Endpoints[0], func() { p.picker.Prefilled(d) }
	}
	return dest, func(o outcome) {
		p.inflight.Done(target)
		if !o.ok {
			return
		}
		if d.Fallback == nil {
			p.picker.Observe(d, openai.Usage{PromptTokens: o.prompt, CachedTokens: o.cached, CachedReported: true})
		}
		p.picker.ObserveTiming(r.model, d, o.ttft-o.waited, o.tpot) // from routing, as the director measures
	}
}

// queuedRouter is a picker behind the director's admission queue (spec.admission): a request no endpoint can
// take, or serve within its TTFT target where waiting for one can help, waits in the queue for room until its
// deadline and is shed then (there is no fallback to degrade to). Requests arriving while others wait join the
// queue behind them. Room is looked for when a request ends and after every round of engine scrapes. The
// deadline is the model's TTFT target; the director also takes the requests' learnt time from leaving the
// queue to their first token from it, which only the picker's own check against what is left of the target
// (Input.Waited) stands in for here.
type queuedRouter struct {
	pickerRouter
	queue *admission.Queue
}

func (q *queuedRouter) pick(r *request) (destination, func(outcome)) {
	arrived := time.Now()
	none := func(outcome) {}
	req := parsed(r)
	defer req.Release() // after the wait: the queue tries an entry only while it waits
	in := picker.Input{Queueing: true}
	if q.queue.Len(r.model) == 0 {
		d, err := q.decide(r, &req, in)
		var nc *picker.NoCapacity
		switch {
		case err == nil:
			q.inflight.Start(d.Target(r.model))
			return q.sent(r, d, 0)
		case !errors.As(err, &nc) || !nc.Saturated:
			return destination{}, none
		}
	}
	var placed picker.Decision
	wait := modelByName(r.model).ttft
	if limit := q.snap.MaxQueueWait(q.tenant()); limit > 0 {
		wait = min(wait, limit)
	}
	set := q.snap.Admission()
	e := &admission.Entry{Model: r.model, Tenant: "t", Class: q.snap.QueueClass(q.tenant()), Cost: 1,
		Deadline: arrived.Add(time.Duration(float64(wait) * timeScale)),
		Try: func() admission.TryResult {
			in.Waited = time.Duration(float64(time.Since(arrived)) / timeScale)
			d, err := q.decide(r, &req, in)
			if err != nil {
				return admission.NoRoom
			}
			placed = d
			q.inflight.Start(d.Target(r.model))
			return admission.Placed
		}}
	out := q.queue.Wait(context.Background(), e, admission.Limits{Length: set.MaxQueueLength, Bytes: set.MaxQueueBytes})
	if out.Result != admission.Started {
		return destination{}, none // shed
	}
	dest, done := q.sent(r, placed, time.Duration(float64(time.Since(arrived))/timeScale))
	return dest, func(o outcome) {
		done(o)
		q.queue.Kick(r.model) // its endpoint has room for a waiting request
	}
}

func chatBody(r *request, model string) []byte {
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": r.maxTokens,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "system", "content": r.system}, {"role": "user", "content": r.user}}})
	return body
}

// send runs one request to its destination and judges it against its model's SLO.
func (e *env) send(ctx context.Context, dest destination, r *request) outcome {
	url, client, model, header := "http://"+dest.endpoint+"/v1/chat/completions", e.client, r.model, http.Header(nil)
	if dest.managed {
		m := e.managed[r.model]
		url, client, model = "https://"+m.Addr()+"/v1/chat/completions", e.tlsClient, r.model+"-managed"
		header = http.Header{"Authorization": {"Bearer " + managedKey}}
	}
	res := loadgen.StreamChatWith(ctx, client, url, header, chatBody(r, model), dest.firstToken)
	o := outcome{ok: res.Usage && res.Status == http.StatusOK, managed: dest.managed, prompt: res.Prompt, cached: res.Cached,
		completion: res.Completion, ttft: dest.waited + time.Duration(float64(res.TTFT)/timeScale), waited: dest.waited}
	if res.Completion > 1 {
		o.tpot = time.Duration(float64(res.Last-res.TTFT) / timeScale / float64(res.Completion-1))
	}
	spec := modelByName(r.model)
	o.good = o.ok && o.ttft <= spec.ttft && o.tpot <= spec.tpot
	return o
}

func modelByName(name string) modelSpec {
	for _, m := range models {
		if m.name == name {
			return m
		}
	}
	log.Fatalf("unknown model %s", name)
	return modelSpec{}
}

// workload draws Poisson arrivals whose rate ramps linearly from 0.5× to 1.5× of each model's capacity over
// half the duration and back, by thinning arrivals at the peak rate; seed draws the arrivals and the prompts.
func workload(d time.Duration, capacity map[string]float64, tag string, seed uint64) []request {
	rng := rand.New(rand.NewPCG(seed, 13))
	var total float64
	for _, m := range models {
		total += capacity[m.name]
	}
	peak := 1.5 * total
	systems := map[string][]string{}
	for _, m := range models {
		for g := range 8 {
			systems[m.name] = append(systems[m.name], words(600, fmt.Sprintf("%s-%s-sys%d-", tag, m.name, g)))
		}
	}
	var out []request
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / peak * float64(time.Second))
		if t >= d {
			return out
		}
		phase := float64(t) / float64(d)
		factor := 0.5 + 2*min(phase, 1-phase) // 0.5 → 1.5 → 0.5
		if rng.Float64() > factor/1.5 {
			continue
		}
		pick := rng.Float64() * total
		var m modelSpec
		for _, m = range models {
			if pick -= capacity[m.name]; pick < 0 {
				break
			}
		}
		input := 500 + rng.IntN(1501)
		r := request{model: m.name, maxTokens: 50 + rng.IntN(451), at: t}
		id := fmt.Sprintf("%s-%d-", tag, len(out))
		if rng.IntN(2) == 0 {
			r.system, r.user = systems[m.name][rng.IntN(8)], words(input-600, id)
		} else {
			r.system, r.user = words(input/2, id+"s"), words(input-input/2, id+"u")
		}
		out = append(out, r)
	}
}

func words(n int, seed string) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", seed, i%97)
	}
	return b.String()
}

// result is one run of one policy.
type result struct {
	requests, good, failed, managed int
	goodput                         float64 // good requests per simulated second over the ramp
	ttftP50, ttftP95, tpotP95       time.Duration
	managedTTFTP95                  time.Duration
	usdPerMOut                      float64
	selfUSD, managedUSD             float64 // what the run cost: engine time at the GPUs' prices, managed tokens
	// rightSizedUSDPerMOut prices each self-hosted request at full-batch GPU time on the hardware that served
	// it (its uncached prompt at the prefill speed, its output at full-batch decode), what a fleet scaled per
	// pool to the load it receives pays; managed requests at the provider's price.
	rightSizedUSDPerMOut float64
	// usdPerGoodMOut is the engine-time and managed spend per 1M output tokens of good requests.
	usdPerGoodMOut float64
	hit            float64
	// managedAtLowLoad counts requests sent to a managed API while the load rose under 0.9× capacity (before
	// any overload), managedAfterPeak those while it fell under 0.9× again (the peak's backlog still draining).
	managedAtLowLoad, managedAfterPeak int
	// predP50, predP95 are observed ÷ predicted TTFT for self-hosted requests (SLO placement).
	predP50, predP95 float64
	// busy is each replica's engine time in the run, elapsed the run's simulated length with its backlog
	// (printed with -v).
	busy    map[string]time.Duration
	elapsed time.Duration
}

// run sends the workload through a router at its arrival times and accounts for it.
func (e *env) run(rt router, work []request, d time.Duration) result {
	busy0 := e.busy()
	out := make([]outcome, len(work))
	var wg sync.WaitGroup
	start := time.Now()
	for i := range work {
		if wait := time.Duration(float64(work[i].at)*timeScale) - time.Since(start); wait > 0 {
			time.Sleep(wait) // the arrival process itself, not synchronisation
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			dest, done := rt.pick(&work[i])
			if dest.endpoint == "" {
				done(outcome{})
				return
			}
			out[i] = e.send(context.Background(), dest, &work[i])
			out[i].predicted, out[i].endpoint = dest.predicted, dest.endpoint
			done(out[i])
		}()
	}
	wg.Wait()
	res := e.account(work, out, d, busy0)
	res.elapsed = time.Duration(float64(time.Since(start)) / timeScale)
	return res
}

// busy is every replica's engine time so far.
func (e *env) busy() map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, r := range e.fl.Replicas {
		m[r.Addr()] = r.BusyTime()
	}
	return m
}

func (e *env) account(work []request, out []outcome, d time.Duration, busy0 map[string]time.Duration) result {
	res := result{requests: len(work)}
	var ttfts, tpots, managedTTFTs []time.Duration
	var ratios []float64
	var prompt, cached, completion, goodCompletion int64
	usd, rightSized := 0.0, 0.0
	res.busy = map[string]time.Duration{}
	for addr, b := range e.busy() {
		usd += (b - busy0[addr]).Hours() * e.price[addr]
		res.busy[addr] = b - busy0[addr]
	}
	res.selfUSD = usd
	for i, o := range out {
		if !o.ok {
			res.failed++
			continue
		}
		if o.good {
			res.good++
		}
		completion += o.completion
		if o.good {
			goodCompletion += o.completion
		}
		ttfts, tpots = append(ttfts, o.ttft), append(tpots, o.tpot)
		spec := modelByName(work[i].model)
		if o.managed {
			res.managed++
			managedTTFTs = append(managedTTFTs, o.ttft)
			managedCost := (float64(o.prompt)*spec.managedIn + float64(o.completion)*spec.managedOut) / 1e6
			usd += managedCost
			rightSized += managedCost
			switch phase := float64(work[i].at) / float64(d); {
			case phase < 0.2: // rising, under 0.9×: the fleet has not been overloaded yet
				res.managedAtLowLoad++
			case phase > 0.8: // falling under 0.9× again, while the peak's backlog drains
				res.managedAfterPeak++
			}
			continue
		}
		prompt += o.prompt
		cached += o.cached
		h := e.speed[o.endpoint]
		rightSized += e.price[o.endpoint] / 3600 * (float64(o.prompt-o.cached)/h.PrefillTokensPerSecond + float64(o.completion)/decodeTPS(h))
		if o.predicted > 0 {
			ratios = append(ratios, float64(o.ttft-o.waited)/float64(o.predicted))
		}
	}
	res.goodput = float64(res.good) / d.Seconds()
	res.ttftP50, res.ttftP95, res.tpotP95 = pct(ttfts, .5), pct(ttfts, .95), pct(tpots, .95)
	res.managedTTFTP95 = pct(managedTTFTs, .95)
	res.usdPerMOut = usd / float64(max(completion, 1)) * 1e6
	res.managedUSD = usd - res.selfUSD
	res.usdPerGoodMOut = usd / float64(max(goodCompletion, 1)) * 1e6
	res.rightSizedUSDPerMOut = rightSized / float64(max(completion, 1)) * 1e6
	res.hit = float64(cached) / float64(max(prompt, 1))
	slices.Sort(ratios)
	if len(ratios) > 0 {
		res.predP50, res.predP95 = ratios[len(ratios)/2], ratios[min(len(ratios)-1, len(ratios)*95/100)]
	}
	return res
}

func pct(ds []time.Duration, p float64) time.Duration { return loadgen.Quantile(ds, p) }
