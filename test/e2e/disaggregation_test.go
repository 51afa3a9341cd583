package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infergate/infergate/fleetsim"
	"github.com/infergate/infergate/test/wait"
)

// disaggFleet is a prefill pool of two H200 replicas and a decode pool of one L40S replica with llm-d's routing
// sidecar, for one 70B model.
const disaggFleet = `timeScale: 0.25
adminAddr: 127.0.0.1:18599
replicas:
- {name: prefill-0, addr: "127.0.0.1:18501", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200}
- {name: prefill-1, addr: "127.0.0.1:18502", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200}
- {name: decode-0, addr: "127.0.0.1:18511", model: meta-llama/Llama-3.3-70B-Instruct, hardware: l40s, sidecar: true, kvBytesPerToken: 163840, engineAddr: "127.0.0.1:18521"}
`

const disaggPolicy = `apiVersion: infergate.io/v1alpha1
kind: Policy
spec:
  hardwareClasses:
    h200: {costPerHour: 3.50, prefillTokensPerSecond: 24000, decodeTokensPerSecond: 3000}
    l40s: {costPerHour: 1.10, prefillTokensPerSecond: 7000, decodeTokensPerSecond: 1200}
  models:
  - name: llama-3.3-70b
    pools:
    - {name: prefill-h200, hardwareClass: h200, engine: vllm, role: prefill, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:18501", "127.0.0.1:18502"]}
    - {name: decode-l40s, hardwareClass: l40s, engine: vllm, role: decode, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:18511"], engineEndpoints: ["127.0.0.1:18521"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840, minUncachedTokens: 1000}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// A long prompt goes through the data plane to the decode replica, whose sidecar has an H200 replica prefill it
// (x-prefiller-host-port, set by infergate) and decodes on the KV cache it pulled; a short one runs whole on the
// decode replica; a client's own x-prefiller-host-port never reaches the sidecar.
func TestDisaggregatedRequestThroughTheSidecar(t *testing.T) {
	st := disaggStack(t, disaggPolicy, disaggFleet)
	legs := func() int64 {
		var n int64
		for _, name := range []string{"prefill-0", "prefill-1"} {
			r, _ := st.Fleet.Replica(name)
			n += r.PrefillLegs()
		}
		return n
	}
	decoder, _ := st.Fleet.Replica("decode-0")
	send := func(content, forged string) (int, string, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "llama-3.3-70b", "max_tokens": 8, "stream": true,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		req, _ := http.NewRequest(http.MethodPost, st.URL+"/v1/chat/completions", strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer sk-demo-acme")
		if forged != "" {
			req.Header.Set("x-prefiller-host-port", forged)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("x-simulated-replica"), string(b)
	}
	long := strings.Repeat("A clause of the master services agreement the model must weigh. ", 300)
	status, by, body := send(long, "")
	if status != http.StatusOK || by != "decode-0" || !strings.Contains(body, "[DONE]") || legs() != 1 || decoder.RemotePrefills() != 1 {
		t.Fatalf("split request: status %d by %q, prefill legs %d, the decoder's remote prefills %d: %.300s",
			status, by, legs(), decoder.RemotePrefills(), body)
	}
	// A short prompt runs whole; the client's forged prefiller (this test's own unreachable address) is stripped
	// before the sidecar sees it, so the request does not fail on it.
	if status, by, body := send("hi", "127.0.0.1:1"); status != http.StatusOK || by != "decode-0" || legs() != 1 || decoder.RemotePrefills() != 1 {
		t.Fatalf("whole request: status %d by %q, prefill legs %d, remote prefills %d: %.300s", status, by, legs(), decoder.RemotePrefills(), body)
	}
}

// A prefiller that fails: llm-d's sidecar answers its error, and Envoy's retry goes to the decode replica's engine
// past the sidecar (engineEndpoints), which prefills the request itself, so no request is lost; infergate then
// rests that prefiller, and the next requests are split onto the other one, or run whole when both rest.
func TestAFailingPrefillerIsLeftOut(t *testing.T) {
	st := disaggStack(t, disaggPolicy, disaggFleet)
	decoder, _ := st.Fleet.Replica("decode-0")
	n := 0
	send := func() {
		t.Helper()
		n++ // a new document each time: its prefiller is the rendezvous winner of its first block
		doc := strings.Repeat(fmt.Sprintf("Exhibit %d of the agreement, to be read in full. ", n), 300)
		if status, body := sendDisagg(t, st.URL, doc); status != http.StatusOK {
			t.Fatalf("request %d: %d %.300s", n, status, body)
		}
		// The prefiller rests once the gateway has settled the request, which may come after the client has read
		// the whole answer: the next request is decided after that.
		settled(t, st)
	}
	fail := func(name string) {
		r, _ := st.Fleet.Replica(name)
		if err := r.SetFaults(fleetsim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// prefill-0 fails: requests split onto it are served past the sidecar, until it rests.
	fail("prefill-0")
	for i := 0; decoder.EngineServed() == 0; i++ {
		if i == 16 {
			t.Fatal("16 prefixes and none was split onto prefill-0")
		}
		send()
	}
	split := decoder.RemotePrefills()
	for range 3 {
		send()
	}
	if past, splits := decoder.EngineServed(), decoder.RemotePrefills()-split; past != 1 || splits != 3 {
		t.Errorf("with prefill-0 resting: %d served past the sidecar in all, %d of 3 split; want 1 and 3", past, splits)
	}
	// prefill-1 fails too, while prefill-0 rests: the next split is served past the sidecar, then both rest and
	// requests run whole.
	fail("prefill-1")
	split = decoder.RemotePrefills()
	for range 4 {
		send()
	}
	if past, splits := decoder.EngineServed(), decoder.RemotePrefills()-split; past != 2 || splits != 0 {
		t.Errorf("with both failing: %d served past the sidecar in all, %d split; want 2 and 0", past, splits)
	}
}

// A prefiller that dies while it prefills: the sidecar's prefill leg is cut, and the request is served whole by the
// decode replica's engine past the sidecar, not lost.
func TestAPrefillerDyingMidwayLosesNoRequest(t *testing.T) {
	st := disaggStack(t, disaggPolicy, disaggFleet)
	decoder, _ := st.Fleet.Replica("decode-0")
	// Both prefillers hang, so the leg is in flight on whichever is named; once a leg has reached one, it dies:
	// its listener and the connections it holds are closed.
	var hung []*fleetsim.Replica
	for _, name := range []string{"prefill-0", "prefill-1"} {
		r, _ := st.Fleet.Replica(name)
		if err := r.SetFaults(fleetsim.Faults{Hang: true}); err != nil {
			t.Fatal(err)
		}
		hung = append(hung, r)
	}
	done := make(chan [2]any, 1)
	go func() {
		status, body := sendDisagg(t, st.URL, strings.Repeat("A clause the prefiller will never finish reading. ", 300))
		done <- [2]any{status, body}
	}()
	wait.For(t, "a prefill leg to reach a prefiller", func() bool { return hung[0].Received()+hung[1].Received() > 0 })
	for _, r := range hung {
		if r.Received() > 0 {
			if err := r.SetFaults(fleetsim.Faults{Refuse: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := <-done
	if got[0].(int) != http.StatusOK || decoder.EngineServed() != 1 || decoder.RemotePrefills() != 0 {
		t.Fatalf("status %v, served past the sidecar %d, split %d: %.300s", got[0], decoder.EngineServed(), decoder.RemotePrefills(), got[1])
	}
}

// disaggStack starts the data plane, infergate and the simulated fleet from a policy and a fleet file, on free
// ports, for the test's lifetime.
func disaggStack(t *testing.T, policy, fleet string) *Stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := stackFiles(t, map[string]string{"policy.yaml": policy, "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml", "fleet.yaml": fleet})
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sendDisagg sends one chat request for the disaggregated model and returns its status and body.
func sendDisagg(t *testing.T, url, content string) (int, string) {
	body, _ := json.Marshal(map[string]any{"model": "llama-3.3-70b", "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer sk-demo-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// disaggregationSeries says whether a series or query reads the split requests' series, which exist only once a
// request was split (TestDisaggregationSeriesAreExported).
func disaggregationSeries(nameOrExpr string) bool {
	return strings.Contains(nameOrExpr, "infergate_disaggregated_")
}

// Once a request was split, every disaggregation series the shipped dashboard and rules read is exported.
func TestDisaggregationSeriesAreExported(t *testing.T) {
	st := disaggStack(t, disaggPolicy, disaggFleet)
	if status, body := sendDisagg(t, st.URL, strings.Repeat("A clause of the agreement the model must weigh. ", 300)); status != http.StatusOK {
		t.Fatalf("%d %.300s", status, body)
	}
	want := queriedSeries(t, disaggregationSeries)
	if len(want) < 2 {
		t.Fatalf("the dashboard and rules read %d disaggregation series: %v", len(want), want)
	}
	if missing := unexported(t, st, want); len(missing) > 0 {
		t.Errorf("queried but not exported after a split request: %v", missing)
	}
}

// sglangFleet is disaggFleet on SGLang servers: the prefillers run in prefill mode, and the decode pod's llm-d
// sidecar speaks SGLang's PD protocol (--kv-connector sglang).
const sglangFleet = `timeScale: 0.25
adminAddr: 127.0.0.1:18599
replicas:
- {name: prefill-0, addr: "127.0.0.1:18501", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200, dialect: sglang, disaggregationMode: prefill}
- {name: prefill-1, addr: "127.0.0.1:18502", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200, dialect: sglang, disaggregationMode: prefill}
- {name: decode-0, addr: "127.0.0.1:18511", model: meta-llama/Llama-3.3-70B-Instruct, hardware: l40s, dialect: sglang, sidecar: true, sidecarConnector: sglang, kvBytesPerToken: 163840, engineAddr: "127.0.0.1:18521"}
`

// The same split through llm-d's sidecar speaking SGLang's PD fields: the long prompt is prefilled by an SGLang
// prefill server for the decode server's bootstrap room, and decoded there; a prefill server that fails costs
// the request nothing (the decode replica's engine serves it whole), and a short prompt runs whole.
func TestDisaggregatedSGLangThroughTheSidecar(t *testing.T) {
	st := disaggStack(t, strings.ReplaceAll(disaggPolicy, "engine: vllm", "engine: sglang"), sglangFleet)
	decoder, _ := st.Fleet.Replica("decode-0")
	legs := func() int64 {
		var n int64
		for _, name := range []string{"prefill-0", "prefill-1"} {
			r, _ := st.Fleet.Replica(name)
			n += r.BootstrapLegs() // prefill legs that came with SGLang's bootstrap fields
		}
		return n
	}
	if status, body := sendDisagg(t, st.URL, strings.Repeat("A clause of the supply agreement the model must weigh. ", 300)); status != http.StatusOK ||
		legs() != 1 || decoder.RemotePrefills() != 1 || decoder.EngineServed() != 0 {
		t.Fatalf("split: %d, prefill legs %d, remote prefills %d, served past the sidecar %d: %.300s", status, legs(), decoder.RemotePrefills(),
			decoder.EngineServed(), body)
	}
	settled(t, st)
	if status, body := sendDisagg(t, st.URL, "hi"); status != http.StatusOK || legs() != 1 {
		t.Fatalf("whole: %d, prefill legs %d: %.300s", status, legs(), body)
	}
	settled(t, st)
	for _, name := range []string{"prefill-0", "prefill-1"} {
		r, _ := st.Fleet.Replica(name)
		if err := r.SetFaults(fleetsim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if status, body := sendDisagg(t, st.URL, strings.Repeat("Another clause, which no prefill server will read. ", 300)); status != http.StatusOK ||
		decoder.EngineServed() != 1 {
		t.Fatalf("with the prefill servers failing: %d, served past the sidecar %d: %.300s", status, decoder.EngineServed(), body)
	}
}
