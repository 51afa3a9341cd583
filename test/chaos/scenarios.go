package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
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
	req    *http.Request
	status int // 0: any 4xx
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
	// A burst of guessed keys, below the per-source limit: every client here shares 127.0.0.1, and a source
	// past it is refused whatever its key (extproc's own tests cover that).
	for i := range 15 {
		req := mk(`{"model":"qwen","messages":[{"role":"user","content":"x"}]}`)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer sk-guess-%d", i))
		out = append(out, hostile{req: req, status: http.StatusUnauthorized})
	}
	return out
}

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
					good := resp.StatusCode == h.status || (h.status == 0 && resp.StatusCode >= 400 && resp.StatusCode < 500 && len(body) > 0)
					if !good {
						l.hostileProblems = append(l.hostileProblems, fmt.Sprintf("hostile request %d: %d %.80s", i, resp.StatusCode, body))
					}
				}
				return nil
			},
			check: func(s *stack, l *load, _ time.Time) []string {
				if !s.gatewayAlive() {
					return []string{"infergate died on hostile input"}
				}
				return l.hostileProblems
			}},
	}
}

// setFailMode rewrites the policy with another quota fail mode and waits for infergate to load it.
func (s *stack) setFailMode(mode string) error {
	s.failMode = mode
	return s.setPolicy(s.policy(), true)
}
