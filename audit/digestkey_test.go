package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"testing"
)

// A reused digester gives the digest a fresh HMAC-SHA256 gives, whatever it digested before, also when many
// goroutines take and release digesters at once.
func TestReusedDigestersMatchAFreshHMAC(t *testing.T) {
	secret := []byte("a test key of thirty-two bytes or more")
	k, err := NewDigestKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	want := func(text string) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(text))
		return hex.EncodeToString(m.Sum(nil))
	}
	texts := []string{"", "yes", "a longer prompt with a system message and a question", string(make([]byte, 100000))}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				text := texts[(g+i)%len(texts)]
				if got := k.Digest([]byte(text)); got != want(text) {
					t.Errorf("Digest(%d bytes) = %s, want %s", len(text), got, want(text))
					return
				}
				d := k.Digester()
				_, _ = d.Write([]byte(text[:len(text)/2]))
				_, _ = d.Write([]byte(text[len(text)/2:]))
				if got := d.Hex(); got != want(text) {
					t.Errorf("streamed digest of %d bytes = %s, want %s", len(text), got, want(text))
				}
				d.Release()
			}
		})
	}
	wg.Wait()
}

// BenchmarkDigest: once warm, a digest costs only its string.
func BenchmarkDigest(b *testing.B) {
	k := EphemeralDigestKey()
	text := []byte("a prompt of a few dozen bytes, as most are")
	b.ReportAllocs()
	for b.Loop() {
		_ = k.Digest(text)
	}
}

// A long text's digest gives way every digestSliceBytes and is the digest Digest gives; a short one's never
// does.
func TestDigestYieldingSlicesLongTexts(t *testing.T) {
	k, err := NewDigestKey([]byte("a test key of thirty-two bytes or more"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		size, yields int
	}{
		{0, 0}, {digestSliceBytes, 0}, {digestSliceBytes + 1, 1}, {4 << 20, 63},
	} {
		text := make([]byte, tc.size)
		for i := range text {
			text[i] = byte(i * 7)
		}
		yields := 0
		if got, want := k.DigestYielding(text, func() { yields++ }), k.Digest(text); got != want {
			t.Errorf("%d bytes: the yielding digest %s differs from %s", tc.size, got, want)
		}
		if yields != tc.yields {
			t.Errorf("%d bytes: %d yields, want %d", tc.size, yields, tc.yields)
		}
	}
}
