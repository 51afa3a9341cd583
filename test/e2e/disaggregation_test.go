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
)

// disaggFleet is a prefill pool of two H200 replicas and a decode pool of one L40S replica with llm-d's routing
// sidecar, for one 70B model.
const disaggFleet = `timeScale: 0.25
adminAddr: 127.0.0.1:18599
replicas:
- {name: prefill-0, addr: "127.0.0.1:18501", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200}
- {name: prefill-1, addr: "127.0.0.1:18502", model: meta-llama/Llama-3.3-70B-Instruct, hardware: h200}
- {name: decode-0, addr: "127.0.0.1:18511", model: meta-llama/Llama-3.3-70B-Instruct, hardware: l40s, sidecar: true, kvBytesPerToken: 163840}
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
    - {name: decode-l40s, hardwareClass: l40s, engine: vllm, role: decode, servedModel: meta-llama/Llama-3.3-70B-Instruct, endpoints: ["127.0.0.1:18511"]}
    disaggregation: {protocol: llm-d, kvBytesPerToken: 163840, minUncachedTokens: 1000}
  tenants:
  - {name: acme, apiKeys: ["sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"], models: ["*"]}
`

// A long prompt goes through the data plane to the decode replica, whose sidecar has an H200 replica prefill it
// (x-prefiller-host-port, set by infergate) and decodes on the KV cache it pulled; a short one runs whole on the
// decode replica; a client's own x-prefiller-host-port never reaches the sidecar.
func TestDisaggregatedRequestThroughTheSidecar(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := stackFiles(t, map[string]string{"policy.yaml": disaggPolicy, "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml", "fleet.yaml": disaggFleet})
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
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

// A prefiller that fails: llm-d's sidecar answers its error, and Envoy's retry names it again, so that request
// fails; infergate then names another prefiller for the next one and its requests succeed.
func TestAFailingPrefillerIsLeftOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := stackFiles(t, map[string]string{"policy.yaml": disaggPolicy, "envoy.yaml": "repo:deploy/envoy/envoy-xds.yaml", "fleet.yaml": disaggFleet})
	st, err := Start(ctx, Options{Root: dir, EnvoyFile: "envoy.yaml", PolicyFile: "policy.yaml", FleetFile: "fleet.yaml", FreePorts: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"prefill-0", "prefill-1"} {
		r, _ := st.Fleet.Replica(name)
		if err := r.SetFaults(fleetsim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
		ok, _ := st.Fleet.Replica(map[string]string{"prefill-0": "prefill-1", "prefill-1": "prefill-0"}[name])
		_ = ok.SetFaults(fleetsim.Faults{})
		statuses := map[int]int{}
		for i := range 4 {
			doc := strings.Repeat(fmt.Sprintf("Exhibit %s-%d of the agreement, to be read in full. ", name, i), 300)
			body, _ := json.Marshal(map[string]any{"model": "llama-3.3-70b", "max_tokens": 4,
				"messages": []map[string]string{{"role": "user", "content": doc}}})
			req, _ := http.NewRequest(http.MethodPost, st.URL+"/v1/chat/completions", strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer sk-demo-acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[resp.StatusCode]++
		}
		// At most the first request, split onto the failing prefiller, fails; the rest go to the other one.
		if statuses[http.StatusOK] < 3 {
			t.Errorf("with %s failing: statuses %v, want at most one failure", name, statuses)
		}
	}
}
