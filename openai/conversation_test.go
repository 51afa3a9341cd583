package openai

import "testing"

func TestConversationKey(t *testing.T) {
	key := func(ep Endpoint, body string) uint64 {
		t.Helper()
		req, err := ParseRequest(ep, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		defer req.Release()
		return req.ConversationKey()
	}
	const sys = `{"role":"system","content":"You are the shared assistant."}`
	first := key(EndpointChat, `{"model":"m","messages":[`+sys+`,{"role":"user","content":"plan a trip"}]}`)
	later := key(EndpointChat, `{"model":"m","messages":[`+sys+`,{"role":"user","content":"plan a trip"},{"role":"assistant","content":"where to?"},{"role":"user","content":"Lisbon"}]}`)
	other := key(EndpointChat, `{"model":"m","messages":[`+sys+`,{"role":"user","content":"fix my code"}]}`)
	switch {
	case first == 0 || first != later:
		t.Errorf("a conversation's turns have keys %x and %x", first, later)
	case first == other:
		t.Error("two conversations behind one system prompt share a key")
	}
	r1 := key(EndpointResponses, `{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"}]}`)
	r2 := key(EndpointResponses, `{"model":"m","instructions":"be long","input":[{"role":"user","content":"hi"}]}`)
	if r1 == 0 || r1 == r2 {
		t.Errorf("responses keys %x and %x: the instructions open the conversation too", r1, r2)
	}
	for ep, body := range map[Endpoint]string{EndpointCompletions: `{"model":"m","prompt":"x"}`,
		EndpointChat: `{"model":"m","messages":[` + sys + `]}`} {
		if k := key(ep, body); k != 0 {
			t.Errorf("%s: key %x, want none", body, k)
		}
	}
}
