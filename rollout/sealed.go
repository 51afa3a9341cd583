package rollout

import (
	"bytes"
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/infergate/infergate/pubsub"
)

// SealedStore keeps every state sealed with the replicas' message key (pubsub.Sealer), so that a Redis client
// without the key cannot write a rollout's state: a state that does not open is read as none — the rollout
// starts over from its compatibility gate, and the next swap replaces the forgery — and is counted.
type SealedStore struct {
	inner  Store
	sealer *pubsub.Sealer
	forged prometheus.Counter

	mu sync.Mutex
	// stored is, per model, the document the last Load read and the state it opened to: Swap compares against
	// what is stored, while the controller holds the state.
	stored map[string]loaded
}

type loaded struct{ doc, state []byte }

// NewSealedStore seals inner's documents with sealer; forged counts states that did not open (nil: uncounted).
func NewSealedStore(inner Store, sealer *pubsub.Sealer, forged prometheus.Counter) *SealedStore {
	return &SealedStore{inner: inner, sealer: sealer, forged: forged, stored: map[string]loaded{}}
}

func sealKey(model string) string { return "infergate:rollout:" + model }

// Load implements Store.
func (s *SealedStore) Load(ctx context.Context, model string) ([]byte, error) {
	doc, err := s.inner.Load(ctx, model)
	if err != nil || doc == nil {
		s.remember(model, nil, nil)
		return nil, err
	}
	state, err := s.sealer.OpenDocument(sealKey(model), doc)
	if err != nil {
		if s.forged != nil {
			s.forged.Inc()
		}
		state = nil // read as none; the next swap replaces it
	}
	s.remember(model, doc, state)
	return state, nil
}

func (s *SealedStore) remember(model string, doc, state []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored[model] = loaded{doc: bytes.Clone(doc), state: bytes.Clone(state)}
}

// Swap implements Store: it replaces what the last Load read, if old is the state that Load gave.
func (s *SealedStore) Swap(ctx context.Context, model string, old, next []byte) (bool, error) {
	s.mu.Lock()
	l, ok := s.stored[model]
	s.mu.Unlock()
	if !ok || !bytes.Equal(l.state, old) {
		return false, nil // read again first
	}
	return s.inner.Swap(ctx, model, l.doc, s.sealer.Seal(sealKey(model), next))
}

// Shared implements Store.
func (s *SealedStore) Shared() bool { return s.inner.Shared() }
