package policies

// OutputBound fixes the most output tokens a request may produce: what admission reserves and SLO placement
// prices, one figure for both. generates is false for a request that produces none (embeddings); asked is the
// client's max_tokens (0: none), prompt the estimated prompt tokens. A request that asked is bounded by its
// ask (not ok when the model's context cannot hold it); one that did not gets the policy's defaultMaxTokens,
// capped by what the context leaves after the prompt, and inject says so: the bound is written into the
// body, so that the engine's own default cannot exceed what was charged.
func (s *Snapshot) OutputBound(m *Model, generates bool, asked, prompt int64) (bound int64, inject bool, ok bool) {
	if !generates {
		return 0, false, true
	}
	ctxTokens := m.ContextTokens
	if asked > ctxTokens {
		return 0, false, false
	}
	if asked > 0 {
		return asked, false, true
	}
	room := ctxTokens - min(max(0, prompt), ctxTokens)
	return max(1, min(int64(s.Policy.Spec.Gateway.DefaultMaxTokens), room)), true, true
}
