package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/admission"
	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/openai"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/placementbus"
)

// The rows: every scenario runs each.
const (
	rowRR       = "round-robin"
	rowLeast    = "least-loaded"
	rowAffinity = "affinity"
	rowSLO      = "slo"
	rowQueue    = "slo+queue"
)

var rows = []string{rowRR, rowLeast, rowAffinity, rowSLO, rowQueue}

// outcome is what became of one request.
type outcome struct {
	served, good bool
	ttft, tpot   time.Duration // TTFT from the request's arrival, the queue's wait included
	completion   int
	prompt       int
	cached       int
	class        int           // the class that served it
	predicted    time.Duration // the picker's predicted TTFT (SLO placement), from the decision
	sentAfter    time.Duration // how long after its arrival it was sent (the queue's wait)
	// The P/D bench's: whether it was a long prompt of a burst, split between a prefiller and its decoder, and
	// when it arrived.
	long, split bool
	arrived     time.Duration
}

// gateway is one row's router over one scenario's fleet, in the sim's time: a request's decision is taken at
// its arrival (or, with the queue, when room comes), it runs on the chosen engine, and what the engine
// reported and the client measured goes back to the picker as the director hands it.
type gateway struct {
	sc       *scenario
	sim      *sim
	fleet    *fleetState
	row      string
	snap     *policies.Snapshot
	model    *policies.Model
	tenant   *policies.Tenant
	replicas []gatewayReplica // request i is decided by replicas[i mod n] (-gateways)
	queue    *admission.Queue
	classOf  map[string]int
	rr       atomic.Uint64
	eps      []string

	// lagMean is the mean of the starved gateway's own delays (-lag): each request reaches its engine that late
	// after its decision, and the TTFT the gateway measures for it carries another such delay.
	lagMean time.Duration
	lagRNG  *rand.Rand

	out      []outcome
	decide   []time.Duration // the machine's time per picker decision
	waiters  sync.WaitGroup
	decideMu sync.Mutex
}

func newGateway(sc *scenario, row string, lag time.Duration, seed uint64) *gateway {
	sm := &sim{}
	port := ":8000"
	if row == rowAggregatedAA {
		port = ":8001" // the same fleet, its endpoints named otherwise (rowAggregatedAA)
	}
	fl, endpoints := newFleet(sc, sm, port)
	g := &gateway{sc: sc, sim: sm, fleet: fl, row: row, classOf: map[string]int{},
		lagMean: lag, lagRNG: rand.New(rand.NewPCG(seed, uint64(sc.id)))}
	placement := policies.PlacementSLO
	if row == rowAffinity || row == rowLeast || row == rowRR {
		placement = policies.PlacementAffinity
	}
	policy := sc.policyYAML(endpoints, placement, row == rowQueue)
	if sc.pd != nil {
		policy = sc.pd.policyYAML(endpoints, row)
	}
	snap, err := policies.Parse("placementbench.yaml", []byte(policy))
	if err != nil {
		log.Fatalf("scenario %d: %v", sc.id, err)
	}
	g.snap, g.tenant = snap, &snap.Policy.Spec.Tenants[0]
	g.model, _ = snap.Model(sc.model)
	for i, eps := range endpoints {
		for _, e := range eps {
			g.classOf[e] = i
			g.eps = append(g.eps, e)
		}
	}
	g.replicas = make([]gatewayReplica, max(1, sc.gateways))
	bus := &placementbus.Bus{After: func(d time.Duration, f func()) { sm.after(d, f) }, Delay: shareDelay}
	for k := range g.replicas {
		r := &g.replicas[k]
		r.inflight = &fleet.InFlight{}
		switch row {
		case rowLeast:
			r.picker = &picker.LeastInFlight{InFlight: r.inflight}
		case rowAffinity, rowSLO, rowQueue, rowAggregated, rowDisaggregated, rowPerRequest, rowPerRequestPrefill, rowAggregatedAA:
			a := picker.NewAffinity(r.inflight, fl)
			a.ChurnEvery = -1
			a.Now = g.sim.Now // the sim's readings are stamped in simulated time
			if len(g.replicas) > 1 && !sc.apart {
				// Replicas share their placements, as infergate serve's do over Redis (share.go in picker).
				a.Placements, a.ChurnEvery = bus.Join(a), picker.DefaultChurnEvery
				if sc.silent {
					a.Placements = withoutPrefill{a.Placements}
				}
			}
			a.PolicyChanged(snap)
			r.picker = a
		}
	}
	if row == rowQueue {
		g.queue = admission.New(sm, nil)
		fl.onRound = g.queue.KickAll
	}
	return g
}

// withoutPrefill publishes everything but the long prompts sent (scenario.silent).
type withoutPrefill struct{ picker.Placements }

func (w withoutPrefill) Publish(pl picker.Placement) {
	if pl.Prefill == 0 {
		w.Placements.Publish(pl)
	}
}

// PublishChurn passes churn reports on whole (picker.ChurnPublisher).
func (w withoutPrefill) PublishChurn(blocks map[string]int) {
	w.Placements.(picker.ChurnPublisher).PublishChurn(blocks)
}

// shareDelay is how long a placement takes to reach the other gateway replicas (Redis pub/sub), in the sim's
// time.
const shareDelay = 5 * time.Millisecond

// gatewayReplica is one gateway replica: its picker and its own count of requests in flight.
type gatewayReplica struct {
	picker   picker.Picker
	inflight *fleet.InFlight
}

// rep is the replica that decides request i: a load balancer in front of the replicas takes them in turn.
func (g *gateway) rep(i int) *gatewayReplica { return &g.replicas[i%len(g.replicas)] }

// run plays the workload and returns every request's outcome.
func (g *gateway) run(work []request, d time.Duration) []outcome {
	g.out = make([]outcome, len(work))
	g.fleet.end = d
	g.sim.after(0, g.fleet.scrape)
	for i := range work {
		g.sim.after(work[i].at, func() { g.arrive(i, &work[i]) })
	}
	g.sim.run()
	g.waiters.Wait()
	return g.out
}

// arrive routes one request as it arrives.
func (g *gateway) arrive(i int, r *request) {
	switch g.row {
	case rowRR:
		g.send(i, r, g.eps[int(g.rr.Add(1))%len(g.eps)], nil)
	case rowQueue:
		g.queued(i, r)
	default:
		req := parsed(r, g.sc.model)
		d, err := g.pick(i, req, picker.Input{})
		req.Release()
		if err != nil {
			return // no endpoint: not served
		}
		g.rep(i).inflight.Start(d.Target(g.sc.model))
		g.send(i, r, d.Endpoints[0], &d)
	}
}

// pick asks the row's picker, timing the decision on the machine's clock.
func (g *gateway) pick(i int, req *openai.Request, in picker.Input) (picker.Decision, error) {
	in.Model, in.Tenant, in.Request = g.model, g.tenant, req
	start := time.Now()
	d, err := g.rep(i).picker.Pick(g.snap, in)
	took := time.Since(start)
	g.decideMu.Lock()
	g.decide = append(g.decide, took)
	g.decideMu.Unlock()
	return d, err
}

// queued is the director's admission path: a request no endpoint can take now, or serve within its target
// where waiting can help, waits in the admission queue for room until its TTFT target and is shed then.
// Requests arriving while others wait join behind them.
func (g *gateway) queued(i int, r *request) {
	arrived := g.sim.Now()
	in := picker.Input{Queueing: true}
	if g.queue.Len(g.sc.model) == 0 {
		req := parsed(r, g.sc.model)
		d, err := g.pick(i, req, in)
		req.Release()
		var nc *picker.NoCapacity
		switch {
		case err == nil:
			g.rep(i).inflight.Start(d.Target(g.sc.model))
			g.send(i, r, d.Endpoints[0], &d)
			return
		case !errors.As(err, &nc) || !nc.Saturated:
			return
		}
	}
	req := parsed(r, g.sc.model)
	set := g.snap.Admission()
	e := &admission.Entry{Model: g.sc.model, Tenant: "t", Class: g.snap.QueueClass(g.tenant), Cost: 1,
		Deadline: arrived.Add(g.sc.ttft),
		Try: func() admission.TryResult {
			in.Waited = g.sim.Now().Sub(arrived)
			d, err := g.pick(i, req, in)
			if err != nil {
				return admission.NoRoom
			}
			g.rep(i).inflight.Start(d.Target(g.sc.model))
			g.send(i, r, d.Endpoints[0], &d)
			return admission.Placed
		}}
	// The queue's Wait blocks its caller; it runs on a goroutine of its own, and the loop goes on once the
	// entry has started, been refused or is parked with its deadline timer set.
	p := &parked{ch: make(chan struct{})}
	g.sim.parked.Store(p)
	g.waiters.Add(1)
	go func() {
		defer g.waiters.Done()
		g.queue.Wait(context.Background(), e, admission.Limits{Length: set.MaxQueueLength, Bytes: set.MaxQueueBytes})
		p.once.Do(func() { close(p.ch) })
		req.Release()
	}()
	<-p.ch
	g.sim.parked.Store(nil)
}

// parked is closed once a waiter's entry has started, been refused, or set its deadline timer.
type parked struct {
	once sync.Once
	ch   chan struct{}
}

// send runs request i on an endpoint now; d is the picker's decision (nil for round-robin).
func (g *gateway) send(i int, r *request, addr string, d *picker.Decision) {
	if lag := g.lag(); lag > 0 {
		g.sim.after(lag, func() { g.forward(i, r, addr, d) })
		return
	}
	g.forward(i, r, addr, d)
}

// lag is one of the starved gateway's own delays (0 without -lag).
func (g *gateway) lag() time.Duration {
	if g.lagMean <= 0 {
		return 0
	}
	return time.Duration(g.lagRNG.ExpFloat64() * float64(g.lagMean))
}

// forward runs request i on its endpoint now, and hands the picker what the engine reported and the gateway
// measured when it ends.
func (g *gateway) forward(i int, r *request, addr string, d *picker.Decision) {
	arrived := epoch.Add(r.at)
	sent := g.sim.Now()
	tokens := make([]string, 0, len(r.system)+len(r.user)+3)
	tokens = append(append(append(append(append(tokens, "<|system|>"), r.system...), "<|user|>"), r.user...), "<|assistant|>")
	var dec picker.Decision
	if d != nil {
		dec = *d
	}
	first := func() {
		if d != nil { // the first token's chunk passes the gateway: the picker's own prefill count forgets it
			g.sim.after(g.lag(), func() { g.rep(i).picker.Prefilled(dec) })
		}
	}
	if dec.Prefill != "" {
		g.split(i, r, addr, dec, tokens, sent)
		return
	}
	g.fleet.submit(addr, tokens, r.output, first, func(q *fleetsim.Sequence, err error) {
		if d != nil {
			g.rep(i).inflight.Done(dec.Target(g.sc.model))
		}
		if err != nil {
			return // refused by the engine (longer than its KV cache): not served
		}
		o := outcome{served: true, ttft: q.FirstToken().Sub(arrived), completion: q.Output(), prompt: q.Prompt(), cached: q.Cached(),
			class: g.classOf[addr]}
		o.predicted, o.sentAfter = dec.Predicted.TTFT, sent.Sub(arrived)
		if q.Output() > 1 {
			o.tpot = q.Finished().Sub(q.FirstToken()) / time.Duration(q.Output()-1)
		}
		o.good = o.ttft <= g.sc.ttftFor(r) && o.tpot <= g.sc.tpot
		o.long, o.arrived = r.long, r.at
		g.out[i] = o
		if d != nil {
			g.rep(i).picker.Observe(dec, openai.Usage{PromptTokens: int64(o.prompt), CachedTokens: int64(o.cached), CachedReported: true})
			g.rep(i).picker.ObserveTiming(g.sc.model, dec, q.FirstToken().Sub(sent)+g.lag(), o.tpot)
		}
		if g.queue != nil {
			g.queue.Kick(g.sc.model)
		}
	})
}

// parsed is the request's body as the gateway parses it; the caller releases it.
func parsed(r *request, model string) *openai.Request {
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": r.output,
		"messages": []map[string]string{{"role": "system", "content": strings.Join(r.system, " ")},
			{"role": "user", "content": strings.Join(r.user, " ")}}})
	req, err := openai.ParseRequest(openai.EndpointChat, body)
	if err != nil {
		log.Fatal(err)
	}
	return &req
}
