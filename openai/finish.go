package openai

import "github.com/valyala/fastjson"

// Finish reasons as the gateway records them: the OpenAI values, and "other" for any value an engine invents
// (vLLM's "abort", a dialect's "error"), so that what is recorded is one of a few constants whatever the
// engine sends.
const (
	FinishStop          = "stop"
	FinishLength        = "length"
	FinishToolCalls     = "tool_calls"
	FinishContentFilter = "content_filter"
	FinishOther         = "other"
)

// finishReason maps an engine's finish_reason to one of the constants ("" for none: null, or not a string).
func finishReason(b []byte) string {
	switch string(b) {
	case "":
		return ""
	case "stop", "eos", "end_turn":
		return FinishStop
	case "length", "max_tokens":
		return FinishLength
	case "tool_calls", "function_call":
		return FinishToolCalls
	case "content_filter":
		return FinishContentFilter
	}
	return FinishOther
}

// choicesFinish reads the first finish reason of a choices array ("" while every choice is still going).
func choicesFinish(choices *fastjson.Value) string {
	for _, c := range choices.GetArray() {
		if r := finishReason(c.GetStringBytes("finish_reason")); r != "" {
			return r
		}
	}
	return ""
}

// responsesFinish is the finish reason of a Responses API response object: completed is a stop, incomplete
// says why (max_output_tokens, content_filter), failed has none (it is an error).
func responsesFinish(resp *fastjson.Value) string {
	switch string(resp.GetStringBytes("status")) {
	case "completed":
		return FinishStop
	case "incomplete":
		if string(resp.GetStringBytes("incomplete_details", "reason")) == "max_output_tokens" {
			return FinishLength
		}
		return finishReason(resp.GetStringBytes("incomplete_details", "reason"))
	}
	return ""
}

// FinishReason reads the finish reason of a non-streaming response body: its first choice's that has one, or a
// Responses API response's status; "" when it has none.
func FinishReason(body []byte) string {
	_, _, finish := AnswerFromJSON(body)
	return finish
}

// docFinish is a parsed response body's finish reason.
func docFinish(doc *fastjson.Value) string {
	if choices := doc.Get("choices"); choices != nil && choices.Type() == fastjson.TypeArray {
		return choicesFinish(choices)
	}
	if doc.Get("output") != nil {
		return responsesFinish(doc)
	}
	return ""
}

// FinishReason is the stream's finish reason: the first a choice reported, or the Responses API's terminal
// event's; "" when none came (an engine cut short, or a stream whose body the gateway did not see).
func (s *SSEScanner) FinishReason() string { return s.finish }
