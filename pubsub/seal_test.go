package pubsub

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// A sealed message opens on its channel with the key it was sealed with, within MaxMessageAge either way;
// anything else is refused with the reason a receiver counts.
func TestSealOpen(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	s, err := NewSealer([]byte("the replicas' shared message key, 32+ bytes"), clock)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewSealer([]byte("another key entirely, thirty-two bytes!!"), clock)
	msg := s.Seal("ch", []byte("payload"))
	if got, err := s.Open("ch", msg); err != nil || string(got) != "payload" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	tampered := bytes.Clone(msg)
	tampered[sealHeader] ^= 1
	tests := []struct {
		name    string
		channel string
		msg     []byte
		want    error
	}{
		{"unsigned", "ch", []byte("payload"), ErrUnsigned},
		{"empty", "ch", nil, ErrUnsigned},
		{"another key", "ch", other.Seal("ch", []byte("payload")), ErrForged},
		{"another channel", "other", msg, ErrForged},
		{"tampered", "ch", tampered, ErrForged},
	}
	for _, tc := range tests {
		if _, err := s.Open(tc.channel, tc.msg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	now = now.Add(MaxMessageAge + time.Millisecond)
	if _, err := s.Open("ch", msg); !errors.Is(err, ErrStale) || Reason(err) != "stale" {
		t.Errorf("an old message: %v", err)
	}
	now = now.Add(-3 * MaxMessageAge)
	if _, err := s.Open("ch", msg); !errors.Is(err, ErrStale) {
		t.Errorf("a message dated ahead: %v", err)
	}
	if _, err := NewSealer([]byte("short"), nil); err == nil {
		t.Error("a short key accepted")
	}
	var none *Sealer
	if got, err := none.Open("ch", []byte("x")); err != nil || string(got) != "x" || string(none.Seal("ch", []byte("x"))) != "x" {
		t.Error("a nil Sealer must pass messages through")
	}
}

// Open reads messages any Redis client can publish: it never panics and opens only what Seal made.
func FuzzOpen(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	s, _ := NewSealer([]byte("the replicas' shared message key, 32+ bytes"), func() time.Time { return now })
	f.Add(s.Seal("ch", []byte("payload")))
	f.Add([]byte{sealMagic, sealVersion})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		payload, err := s.Open("ch", msg)
		if err == nil && !bytes.Equal(s.Seal("ch", payload)[sealHeader:], msg[sealHeader:]) {
			t.Fatalf("opened %q, which Seal did not make", msg)
		}
	})
}
