package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/infergate/infergate/test/loadgen"
)

// sample is one request as the client saw it.
type sample struct {
	class   int
	sent    time.Time
	done    time.Time
	status  int
	ttft    time.Duration // real time
	replica string
	usage   bool
}

// load sends requests to the replicas' data planes in turn and keeps what came back.
type load struct {
	urls         []string
	singleTenant bool
	client       *http.Client
	next         atomic.Uint64
	seq          atomic.Uint64

	wg      sync.WaitGroup
	mu      sync.Mutex
	samples []sample
}

func newLoad(reps []gatewayReplica, singleTenant bool) *load {
	l := &load{singleTenant: singleTenant, client: &http.Client{Timeout: 2 * time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 0}}}
	for _, r := range reps {
		l.urls = append(l.urls, r.url+"/v1/chat/completions")
	}
	return l
}

// body is a streaming chat request with a prompt of its own (about 100 tokens, no prefix shared with another).
func (l *load) body() []byte {
	n := l.seq.Add(1)
	filler := strings.Repeat(fmt.Sprintf("request %d asks about something else entirely. ", n), 8)
	return fmt.Appendf(nil, `{"model":"big","stream":true,"stream_options":{"include_usage":true},"max_tokens":%d,`+
		`"messages":[{"role":"user","content":%q}]}`, maxTokens, filler)
}

// send makes one request of class c and records it.
func (l *load) send(ctx context.Context, c int) sample {
	key := classes[c].key
	if l.singleTenant {
		key = everyoneKey
	}
	url := l.urls[int(l.next.Add(1))%len(l.urls)]
	s := sample{class: c, sent: time.Now()}
	r := loadgen.StreamChat(ctx, l.client, url, http.Header{"Authorization": {"Bearer " + key}}, l.body())
	s.status, s.ttft, s.replica, s.usage, s.done = r.Status, r.TTFT, r.Replica, r.Usage, time.Now()
	return s
}

func (l *load) keep(s sample) {
	l.mu.Lock()
	l.samples = append(l.samples, s)
	l.mu.Unlock()
}

// open sends Poisson arrivals at rate per second for d, each class by its share; it returns when the last
// one was sent (the requests finish in the background: wait collects them).
func (l *load) open(ctx context.Context, rate float64, d time.Duration) {
	end := time.Now().Add(d)
	next := time.Now()
	for next.Before(end) && ctx.Err() == nil {
		next = next.Add(time.Duration(rand.ExpFloat64() / rate * float64(time.Second)))
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait) // pacing an open-loop generator, not synchronisation
		}
		c := pick()
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.keep(l.send(ctx, c))
		}()
	}
}

// pick draws a class by share.
func pick() int {
	x := rand.Float64()
	for i, c := range classes {
		if x < c.share {
			return i
		}
		x -= c.share
	}
	return len(classes) - 1
}

// refusedPause is how long a closed-loop client waits after a refusal or a failure before it sends again, as a
// client honouring 429 would: without it the clients beyond what the engines queue resent at once, some 3,000
// refusals a second, and the busy gateway took the CPU the simulated fleet needed (calibration readings of 0).
const refusedPause = 50 * time.Millisecond

// closedLoop runs n clients of the first class back to back for d and returns their samples.
func (l *load) closedLoop(ctx context.Context, n int, d time.Duration) []sample {
	end := time.Now().Add(d)
	var mu sync.Mutex
	var out []sample
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				s := l.send(ctx, 0)
				if s.done.After(end) {
					break // finished after the window: not counted
				}
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
				if s.status != http.StatusOK {
					time.Sleep(refusedPause) // pacing a refused or failed client, not synchronisation
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// wait collects every request sent by open once it has ended.
func (l *load) wait() []sample {
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.samples
}
