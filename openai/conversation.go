package openai

import "github.com/zeebo/xxh3"

// ConversationKey names the conversation a request continues, without a conversation header: a hash of its
// instructions and messages up to and including the first user message — the system prompt and the question
// that opened the conversation, which every later turn repeats. Conversations that share a long system
// prompt (one KV-cache prefix group) still get keys of their own. 0 when the prompt is not a message list
// with a user message (a completions prompt, a Responses input string, embeddings).
func (r *Request) ConversationKey() uint64 {
	if len(r.Prompt) == 0 || r.Prompt[0] != '[' {
		return 0
	}
	h := xxh3.New()
	write := func(b []byte) { _, _ = h.Write(b) }
	Compact(r.Instructions, write)
	c := Elements(r.Prompt)
	for m, ok := c.Next(); ok; m, ok = c.Next() {
		Compact(m, write)
		if role, _ := stringValue(Member(m, "role")); role == "user" {
			return h.Sum64() | 1
		}
	}
	return 0
}
