package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
)

// SGLang's prefill/decode disaggregation as llm-d's routing sidecar runs it with --kv-connector sglang: the
// sidecar adds bootstrap_host (the prefiller's host), bootstrap_port (the prefiller's bootstrap server, 8998 by
// default) and bootstrap_room (a random id) to the body and sends it to the prefiller and to its own decoder at
// once; the prefill-mode server prefills it and hands the KV cache over to the decode server of that room, which
// decodes. Here the decode leg waits for the prefill leg's answer (the KV cache is ready when it comes) and then
// pulls the cache as the NIXL path does; a failed prefill leg fails the decode leg with a 502, as an SGLang
// decode server whose bootstrap failed answers an error.

// ConnectorSGLang is ReplicaConfig.SidecarConnector for SGLang's PD protocol.
const ConnectorSGLang = "sglang"

// sglangBootstrapPort is llm-d's default SGLANG_BOOTSTRAP_PORT.
const sglangBootstrapPort = 8998

// sglangPrefillLeg sends the request, with SGLang's bootstrap fields, to the prefiller and waits for its answer;
// on a failed leg it has written a 502 to w and returns false.
func (r *Replica) sglangPrefillLeg(w http.ResponseWriter, req *http.Request, kind string, raw []byte, prefiller string) bool {
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return false
	}
	host, _, err := net.SplitHostPort(prefiller)
	if err != nil {
		host = prefiller
	}
	body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"] = host, sglangBootstrapPort, rand.Int64()
	b, _ := json.Marshal(body) // decoded from JSON: it encodes
	// The prefill leg outlives the decode leg's client, as llm-d's sidecar sends it (context.WithoutCancel).
	out, err := http.NewRequestWithContext(context.WithoutCancel(req.Context()), http.MethodPost, "http://"+prefiller+"/v1/"+kind, bytes.NewReader(b))
	if err != nil {
		vllmError(w, http.StatusBadGateway, "BadGatewayError", err.Error())
		return false
	}
	out.Header.Set("Content-Type", "application/json")
	resp, err := r.legClient.Do(out)
	if err != nil {
		vllmError(w, http.StatusBadGateway, "BadGatewayError", "sglang bootstrap: the prefill server failed: "+err.Error())
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		vllmError(w, http.StatusBadGateway, "BadGatewayError", "sglang bootstrap: the prefill server answered "+resp.Status)
		return false
	}
	r.remotePrefills.Add(1)
	return true
}

// sglangPrefill is a prefill-mode server's side: it prefills the prompt (one token) for the room's decode server
// and answers once the KV cache is ready to hand over.
func (r *Replica) sglangPrefill(w http.ResponseWriter, req *http.Request, tokens []string) {
	r.prefillLegs.Add(1)
	r.bootstrapLegs.Add(1)
	s, err := r.eng.submit(req.Context(), tokens, 1)
	if err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	for range s.tokens {
	}
	if req.Context().Err() != nil {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "prefill", "prompt_tokens": s.prompt, "cached_tokens": s.cached})
}

// BootstrapLegs counts the prefill legs this replica served in SGLang's prefill mode (a request with
// bootstrap fields), among PrefillLegs.
func (r *Replica) BootstrapLegs() int64 { return r.bootstrapLegs.Load() }
