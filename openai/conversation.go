package openai

import (
	"github.com/valyala/fastjson"
	"github.com/zeebo/xxh3"
)

// ConversationKey names the conversation a request continues, without a conversation header: a hash of its
// instructions and messages up to and including the first user message — the system prompt and the question
// that opened the conversation, which every later turn repeats. Conversations that share a long system
// prompt (one KV-cache prefix group) still get keys of their own. 0 when the prompt is not a message list
// with a user message (a completions prompt, a Responses input string, embeddings).
func (r *Request) ConversationKey() uint64 {
	if r.Prompt == nil || r.Prompt.Type() != fastjson.TypeArray {
		return 0
	}
	h := xxh3.New()
	var buf []byte
	if r.Instructions != nil {
		buf = r.Instructions.MarshalTo(buf)
	}
	for _, m := range r.Prompt.GetArray() {
		buf = m.MarshalTo(buf)
		_, _ = h.Write(buf)
		buf = buf[:0]
		if string(m.GetStringBytes("role")) == "user" {
			return h.Sum64() | 1
		}
	}
	return 0
}
