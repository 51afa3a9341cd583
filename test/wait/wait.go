// Package wait polls a condition in tests that watch something happen in the background (a settlement
// flushed, a reload picked up). Its deadline guards against a hang; it is not a timing assertion.
package wait

import (
	"testing"
	"time"
)

// For polls cond every few milliseconds until it holds, failing the test after 10 s.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Until(10*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// Within is For with its own deadline, for conditions that take many seconds by design (a rollout's steps).
func Within(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	if !Until(limit, cond) {
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
}

// Until polls cond until it holds or limit passes and reports whether it held, for a test that explains a
// failure itself (with the values it waited on) rather than with For's message.
func Until(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
