package extproc

import (
	"sync"
	"testing"

	"github.com/infergate/infergate/fleet"
	"github.com/infergate/infergate/picker"
	"github.com/infergate/infergate/policies"
	"github.com/infergate/infergate/test/wait"
)

// prefilledPicker counts the Prefilled calls the picker hears.
type prefilledPicker struct {
	picker.Picker
	mu sync.Mutex
	n  int
}

func (p *prefilledPicker) Prefilled(d picker.Decision) {
	p.mu.Lock()
	p.n++
	p.mu.Unlock()
	p.Picker.Prefilled(d)
}

func (p *prefilledPicker) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// The picker hears that a request's prompt is prefilled when its first chunk with generated content passes,
// before the data plane has that chunk's answer (so before the client has the token): SLO placement stops
// counting the prompt as prefill ahead of the next request there, which may come as soon as the client reads
// the token. Later chunks say nothing more; the settlement says it once again (the request ended), which is
// also how a request that ends without a token is heard.
func TestFirstContentTellsThePickerThePromptIsPrefilled(t *testing.T) {
	snap, err := policies.LoadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mode any
	}{{"streamed", modeStreamed}, {"full-duplex", modeFullDuplex}} {
		t.Run(tc.name, func(t *testing.T) {
			p := &prefilledPicker{Picker: picker.ForStore(policies.NewStaticStore(snap), &fleet.InFlight{}, nil)}
			var c config
			c.Director.Picker = p
			h := newHarnessWith(t, snap, c)
			s := streamChat(t, h, tc.mode)
			s.send(respHeaders("200", false, "content-type", "text/event-stream"))
			s.recv()
			if n := p.count(); n != 0 {
				t.Fatalf("%d Prefilled calls at the response headers, want none before a token", n)
			}
			first := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			s.send(respBody(first, false))
			if tc.mode == modeStreamed {
				s.forwardedChunk(nil, first)
				if n := p.count(); n != 1 {
					t.Fatalf("%d Prefilled calls once the first token's chunk was answered, want 1", n)
				}
			} else { // FULL_DUPLEX_STREAMED answers are decoupled from chunks
				wait.For(t, "the first token's Prefilled", func() bool { return p.count() == 1 })
			}
			s.send(respBody([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n"), true))
			if tc.mode == modeFullDuplex {
				s.recvStreamed(false, 64)
			} else {
				s.recv()
			}
			h.settlement()
			if n := p.count(); n != 2 {
				t.Errorf("%d Prefilled calls after the settlement, want 2 (first token, end)", n)
			}
		})
	}
}
