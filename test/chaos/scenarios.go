package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/fleetsim"
)

// scenario injects one fault into the running stack under load and heals it.
type scenario struct {
	name string
	// inject starts the fault; heal ends it (nil: nothing to heal). Both return an error only when the suite
	// itself cannot go on.
	inject, heal func(s *stack, l *load) error
	// cutsStreams marks faults that by design cut streams already in flight — a replica or the gateway dying
	// mid-response: those streams cannot be retried (the client already has part of the answer). Losses are
	// accepted up to the concurrency in flight at the moment of the fault.
	cutsStreams bool
	// hold is how long the fault lasts (default faultFor).
	hold time.Duration
	// check runs at the end for scenario-specific assertions; it returns problems.
	check func(s *stack, l *load, from time.Time) []string
}

func fault(s *stack, replica string, f fleetsim.Faults) error {
	return s.replicas[replica].SetFaults(f)
}

func faults(names []string, f fleetsim.Faults) func(*stack, *load) error {
	return func(s *stack, _ *load) error {
		for _, n := range names {
			if err := fault(s, n, f); err != nil {
				return err
			}
		}
		return nil
	}
}

// hostile is one request a hostile tenant sends and the status it must get.
type hostile struct {
	req      *http.Request
	status   int // 0: any 4xx
	orStatus int // another status that is right
}

// hostileRequests are what a hostile tenant with a valid key sends: clear 4xx errors, except a valid request
// with forged routing headers, which is routed as if it had none.
func hostileRequests(s *stack) []hostile {
	mk := func(body string, hdr ...string) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.steadyKey)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return req
	}
	out := []hostile{
		{req: mk(`{"model":"qwen","messages":` + strings.Repeat("[", 2_000_000))},
		{req: mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}],"max_tokens":9223372036854775807}`)},
		{req: mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}],"model":"llama"}`)},
		{req: mk("{\"model\":\"qwen\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\\n\"}]}")},
		{req: mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}],"max_tokens":4}`, contract.HeaderDestination, "169.254.169.254:80",
			contract.HeaderPool, contract.FallbackPool("managed")), status: http.StatusOK},
	}
	// Guessed keys past the per-source limit: every client here shares 127.0.0.1, so the guesses beyond the
	// burst get 429 while the steady load's valid key, from the same address, goes on (the scenario's check).
	for i := range 40 {
		req := mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}]}`)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-guess-%d", i))
		out = append(out, hostile{req: req, status: http.StatusUnauthorized, orStatus: http.StatusTooManyRequests})
	}
	// Then a valid key from the same address: never refused for the guesses.
	out = append(out, hostile{req: mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}],"max_tokens":4}`), status: http.StatusOK})
	return out
}

// elementBodies are what a hostile tenant with a valid key sends to grow the gateway's memory: bodies of about
// 3.9 MB holding two million elements in a field the gateway ignores. Each must be routed or get a clear
// error (503 while the gateway holds as many bodies as it may, or because a prompt estimated from that many
// bytes fits no replica).
func elementBodies(s *stack, n int) []*http.Request {
	body := `{"model":"qwen","messages":[{"role":"user","content":"x"}],"max_tokens":4,"logit_bias":[` +
		strings.Repeat("0,", 1_950_000) + `0]}`
	out := make([]*http.Request, n)
	for i := range out {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.steadyKey)
		req.Header.Set("Content-Type", "application/json")
		out[i] = req
	}
	return out
}

// maxHostileRSS is the most resident memory infergate may reach in the hostile scenario.
const maxHostileRSS = 512 << 20

func scenarios() []scenario {
	llama := []string{"llama-0", "llama-1"}
	qwen := []string{"qwen-0", "qwen-1"}
	redisRestart := func(s *stack, _ *load) error { return s.startRedis() }
	return []scenario{
		{name: "baseline (no fault)"},
		{name: "replica 5xx", inject: faults(llama[:1], fleetsim.Faults{ErrorRate: 1}), heal: faults(llama[:1], fleetsim.Faults{})},
		{name: "replica refuses connections", cutsStreams: true,
			inject: faults(llama[:1], fleetsim.Faults{Refuse: true}), heal: faults(llama[:1], fleetsim.Faults{})},
		{name: "replica hangs", inject: faults(qwen[:1], fleetsim.Faults{Hang: true}), heal: faults(qwen[:1], fleetsim.Faults{})},
		{name: "pool down, with fallback", cutsStreams: true,
			inject: faults(llama, fleetsim.Faults{Refuse: true}), heal: faults(llama, fleetsim.Faults{})},
		{name: "pool down, no fallback", cutsStreams: true,
			inject: faults(qwen, fleetsim.Faults{Refuse: true}), heal: faults(qwen, fleetsim.Faults{})},
		{name: "Redis SIGKILL, fail-open", inject: func(s *stack, _ *load) error { s.redis.signal(syscall.SIGKILL); <-s.redis.done; return nil },
			heal: redisRestart},
		{name: "Redis SIGSTOP, fail-open", inject: func(s *stack, _ *load) error { s.redis.signal(syscall.SIGSTOP); return nil },
			heal: func(s *stack, _ *load) error { s.redis.signal(syscall.SIGCONT); return nil }},
		{name: "Redis SIGKILL, fail-closed",
			inject: func(s *stack, _ *load) error {
				if err := s.setFailMode("closed"); err != nil {
					return err
				}
				s.redis.signal(syscall.SIGKILL)
				<-s.redis.done
				return nil
			},
			heal: func(s *stack, l *load) error {
				if err := redisRestart(s, l); err != nil {
					return err
				}
				return waitFor(10*time.Second, "quota store up", func() bool { return s.metric("infergate_quota_backend_up", "") == 1 })
			}},
		{name: "Redis SIGSTOP, fail-closed",
			inject: func(s *stack, _ *load) error { s.redis.signal(syscall.SIGSTOP); return nil },
			heal: func(s *stack, _ *load) error {
				s.redis.signal(syscall.SIGCONT)
				if err := waitFor(10*time.Second, "quota store up", func() bool { return s.metric("infergate_quota_backend_up", "") == 1 }); err != nil {
					return err
				}
				return s.setFailMode("open")
			}},
		{name: "infergate SIGTERM + restart", inject: func(s *stack, _ *load) error { s.stopGateway(syscall.SIGTERM); return nil },
			heal: func(s *stack, _ *load) error { return s.startGateway() }, hold: 2 * time.Second},
		{name: "infergate SIGKILL + restart", cutsStreams: true,
			inject: func(s *stack, _ *load) error { s.stopGateway(syscall.SIGKILL); return nil },
			heal:   func(s *stack, _ *load) error { return s.startGateway() }, hold: 2 * time.Second},
		{name: "invalid policy mid-load",
			inject: func(s *stack, _ *load) error {
				return s.setPolicy("apiVersion: infergate.io/v1alpha1\nkind: Policy\nspec: {models: [}\n", false)
			},
			heal: func(s *stack, _ *load) error { return s.setPolicy(s.policy(), true) }},
		{name: "3x overload",
			inject: func(s *stack, l *load) error { l.extra = l.addSteady(2 * steadyWorkers); return nil },
			heal:   func(s *stack, l *load) error { l.extra(); return nil },
			check: func(s *stack, _ *load, _ time.Time) []string {
				if !httpOK("http://"+s.metricsAddr+"/healthz") || s.metric("infergate_requests_total", `outcome="routed"`) < 0 {
					return []string{"health or metrics stopped answering under overload"}
				}
				return nil
			}},
		{name: "hostile inputs",
			inject: func(s *stack, l *load) error {
				for i, h := range hostileRequests(s) {
					resp, err := l.client.Do(h.req)
					if err != nil {
						l.hostileProblems = append(l.hostileProblems, fmt.Sprintf("hostile request %d: no answer: %v", i, err))
						continue
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					good := resp.StatusCode == h.status || (h.orStatus != 0 && resp.StatusCode == h.orStatus) ||
						(h.status == 0 && resp.StatusCode >= 400 && resp.StatusCode < 500 && len(body) > 0)
					if !good {
						l.hostileProblems = append(l.hostileProblems, fmt.Sprintf("hostile request %d: %d %.80s", i, resp.StatusCode, body))
					}
				}
				l.hostileProblems = append(l.hostileProblems, sendElementBodies(l, elementBodies(s, 16))...)
				return s.publishForgeries(context.Background())
			},
			check: func(s *stack, l *load, _ time.Time) []string {
				if !s.gatewayAlive() {
					return []string{"infergate died on hostile input"}
				}
				if rss := s.gatewayPeakRSS(); rss > maxHostileRSS {
					l.hostileProblems = append(l.hostileProblems, fmt.Sprintf("infergate's resident memory reached %d MiB (at most %d)", rss>>20, maxHostileRSS>>20))
				}
				return append(l.hostileProblems, s.forgeriesDropped()...)
			}},
	}
}

// setFailMode rewrites the policy with another quota fail mode and waits for infergate to load it.
func (s *stack) setFailMode(mode string) error {
	s.failMode = mode
	return s.setPolicy(s.policy(), true)
}

// sendElementBodies sends the bodies at once and reports any that got neither a routed answer nor a clear error.
func sendElementBodies(l *load, reqs []*http.Request) []string {
	var mu sync.Mutex
	var problems []string
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			resp, err := l.client.Do(req)
			if err != nil {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("element body %d: no answer: %v", i, err))
				mu.Unlock()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK && !json.Valid(body) || resp.StatusCode != http.StatusOK && !strings.Contains(string(body), `"error"`) {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("element body %d: %d %.80s", i, resp.StatusCode, body))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return problems
}
