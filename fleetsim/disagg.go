package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// Prefill/decode disaggregation as llm-d and vLLM do it (docs/disaggregation.md): a decode replica with a
// routing sidecar (ReplicaConfig.Sidecar) that finds x-prefiller-host-port on a request runs the prefill leg on
// that replica — the body with kv_transfer_params {do_remote_decode: true}, not streamed, max_tokens 1 — then,
// as vLLM's NIXL connector does, pulls the prompt's KV cache (its transfer time: ReplicaConfig.KVBytesPerToken
// over TransferGbps) and decodes on its own engine, whose prefill is then a cache hit. A failed prefill leg's
// status goes back to the client, as llm-d's sidecar relays it. A replica asked with do_remote_decode answers
// with the kv_transfer_params a decoder needs.

// headerPrefiller is llm-d's header naming the prefill replica.
const headerPrefiller = "x-prefiller-host-port"

// kvTransferParams is vLLM's kv_transfer_params, as the NIXL connector reads and writes it.
type kvTransferParams struct {
	DoRemoteDecode  bool `json:"do_remote_decode"`
	DoRemotePrefill bool `json:"do_remote_prefill"`
	RemoteEngineID  any  `json:"remote_engine_id"`
	RemoteBlockIDs  any  `json:"remote_block_ids"`
	RemoteHost      any  `json:"remote_host"`
	RemotePort      any  `json:"remote_port"`
}

// prefillLeg asks the prefiller to prefill the request and returns the KV parameters it answered; on a failed
// leg it has written the prefiller's status (or a 502) to w and returns false.
func (r *Replica) prefillLeg(w http.ResponseWriter, req *http.Request, kind string, raw []byte, prefiller string) bool {
	var leg map[string]any
	if err := json.Unmarshal(raw, &leg); err != nil {
		vllmError(w, http.StatusBadRequest, "BadRequestError", "invalid JSON body: "+err.Error())
		return false
	}
	leg["kv_transfer_params"] = kvTransferParams{DoRemoteDecode: true}
	leg["stream"], leg["max_tokens"] = false, 1
	delete(leg, "stream_options")
	delete(leg, "max_completion_tokens")
	b, _ := json.Marshal(leg) // decoded from JSON: it encodes
	out, err := http.NewRequestWithContext(req.Context(), http.MethodPost, "http://"+prefiller+"/v1/"+kind, bytes.NewReader(b))
	if err != nil {
		vllmError(w, http.StatusBadGateway, "BadGatewayError", err.Error())
		return false
	}
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set("X-Request-Id", req.Header.Get("X-Request-Id"))
	resp, err := r.legClient.Do(out)
	if err != nil {
		vllmError(w, http.StatusBadGateway, "BadGatewayError", "prefill leg: "+err.Error())
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var answer struct {
		KV *kvTransferParams `json:"kv_transfer_params"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &answer) != nil || answer.KV == nil || !answer.KV.DoRemotePrefill {
		status := resp.StatusCode
		if status == http.StatusOK {
			status = http.StatusBadGateway // answered, but with nothing to pull
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return false
	}
	r.remotePrefills.Add(1)
	return true
}

// pullKV waits out moving the prompt's KV cache from the prefiller and adds it to this replica's cache.
func (r *Replica) pullKV(ctx context.Context, tokens []string) bool {
	if r.cfg.KVBytesPerToken > 0 {
		gbps := r.cfg.TransferGbps
		if gbps <= 0 {
			gbps = 100
		}
		d := time.Duration(float64(len(tokens)) * float64(r.cfg.KVBytesPerToken) * 8 / (gbps * 1e9) * float64(time.Second))
		select {
		case <-time.After(time.Duration(float64(d) * r.eng.cfg.TimeScale)):
		case <-ctx.Done():
			return false
		}
	}
	r.eng.importKV(tokens)
	return true
}

// prefilledFor is the kv_transfer_params a prefill replica answers: where a decoder pulls the blocks from.
func (r *Replica) prefilledFor(id string) kvTransferParams {
	return kvTransferParams{DoRemotePrefill: true, RemoteEngineID: r.cfg.Name, RemoteBlockIDs: []string{id},
		RemoteHost: r.cfg.Addr, RemotePort: 5600}
}

// RemotePrefills counts the requests this replica's sidecar had prefilled elsewhere; PrefillLegs the prefill
// legs it served for others.
func (r *Replica) RemotePrefills() int64 { return r.remotePrefills.Load() }

// PrefillLegs counts the prefill legs (do_remote_decode) this replica served.
func (r *Replica) PrefillLegs() int64 { return r.prefillLegs.Load() }
