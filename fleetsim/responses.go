package fleetsim

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// responsesUsage is the Responses API's usage object.
func responsesUsage(s *seq) map[string]any {
	return map[string]any{"input_tokens": s.prompt, "input_tokens_details": map[string]any{"cached_tokens": s.cached},
		"output_tokens": s.out, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": s.prompt + s.out}
}

// responseObject is a finished Responses API response holding text.
func responseObject(id, model, text string, created int64, s *seq) map[string]any {
	return map[string]any{"id": id, "object": "response", "created_at": created, "status": "completed", "model": model,
		"output": []any{map[string]any{"type": "message", "id": "msg_" + id, "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}},
		"usage": responsesUsage(s)}
}

// responses answers POST /v1/responses as vLLM does: a response object, or, streamed, the created event, one
// output_text delta per token and the completed event carrying the usage.
func (r *Replica) responses(w http.ResponseWriter, req *http.Request, s *seq, model, id string, stream bool) {
	created := time.Now().Unix()
	if !stream {
		w.Header().Set("x-simulated-replica", r.cfg.Name)
		if !wait(req, s) {
			return
		}
		var text strings.Builder
		for i := range s.out {
			text.WriteString(word(i))
		}
		writeJSON(w, http.StatusOK, responseObject(id, model, text.String(), created, s))
		return
	}
	ev := r.startEvents(w)
	seqNo := 0
	send := func(typ string, e map[string]any) {
		e["type"], e["sequence_number"] = typ, seqNo
		seqNo++
		b, _ := json.Marshal(e)
		ev.event(typ, b)
	}
	inProgress := map[string]any{"id": id, "object": "response", "created_at": created, "status": "in_progress", "model": model,
		"output": []any{}}
	send("response.created", map[string]any{"response": inProgress})
	var text strings.Builder
	finished := eachToken(req, s, func(i int) {
		text.WriteString(word(i))
		send("response.output_text.delta", map[string]any{"item_id": "msg_" + id, "output_index": 0, "content_index": 0,
			"delta": word(i)})
	})
	if finished {
		send("response.completed", map[string]any{"response": responseObject(id, model, text.String(), created, s)})
	}
}
