package pubsub

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Any Redis client may publish on the channels gateway replicas share: unauthenticated, two forged placement
// messages moved a warm conversation to a cold replica. A Sealer signs what a replica publishes with a key the
// replicas share (a Secret) and opens only what was signed with it, recently: HMAC-SHA256 over the channel, a
// timestamp and the payload. Messages without a seal, with a wrong one, or older than MaxMessageAge (or dated
// that far ahead) are dropped, and their receivers count them. A message replayed within MaxMessageAge is
// accepted: it says again what a replica said then.

// MaxMessageAge bounds how old (by the sender's clock against the receiver's) a sealed message may be.
const MaxMessageAge = 30 * time.Second

// MinKeyBytes is the shortest message key accepted.
const MinKeyBytes = 32

const (
	sealMagic    = 0xA5
	sealVersion  = 1
	sealHeader   = 2 + 8 // magic, version, unix milliseconds
	sealMACBytes = sha256.Size
)

// Why a message was not opened; receivers count them as unsigned, forged and stale.
var (
	ErrUnsigned = errors.New("message not sealed")
	ErrForged   = errors.New("message seal does not verify")
	ErrStale    = errors.New("message too old or dated ahead")
)

// Sealer signs and opens messages with one key. A nil *Sealer passes messages through unsigned (a single
// replica, or replicas not given a key).
type Sealer struct {
	key []byte
	now func() time.Time
}

// NewSealer seals with key (at least MinKeyBytes); now is the clock (nil: time.Now).
func NewSealer(key []byte, now func() time.Time) (*Sealer, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("a Redis message key needs at least %d bytes, got %d", MinKeyBytes, len(key))
	}
	if now == nil {
		now = time.Now
	}
	return &Sealer{key: bytes.Clone(key), now: now}, nil
}

// LoadSealer reads a key file (a mounted Secret): its bytes, less surrounding whitespace, are the key.
func LoadSealer(path string) (*Sealer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return nil, err
	}
	if len(b) > 4096 {
		return nil, fmt.Errorf("%s: over 4096 bytes; a key file holds the key alone", path)
	}
	s, err := NewSealer(bytes.TrimSpace(b), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Seal returns payload signed for channel, or payload itself from a nil Sealer.
func (s *Sealer) Seal(channel string, payload []byte) []byte {
	if s == nil {
		return payload
	}
	out := make([]byte, 0, sealHeader+len(payload)+sealMACBytes)
	out = append(out, sealMagic, sealVersion)
	out = binary.LittleEndian.AppendUint64(out, uint64(s.now().UnixMilli()))
	out = append(out, payload...)
	return append(out, s.mac(channel, out)...)
}

// Open returns the payload of a message sealed for channel, or why it is refused. A nil Sealer returns every
// message as it is.
func (s *Sealer) Open(channel string, msg []byte) ([]byte, error) {
	if s == nil {
		return msg, nil
	}
	if len(msg) < sealHeader+sealMACBytes || msg[0] != sealMagic || msg[1] != sealVersion {
		return nil, ErrUnsigned
	}
	body, mac := msg[:len(msg)-sealMACBytes], msg[len(msg)-sealMACBytes:]
	if !hmac.Equal(mac, s.mac(channel, body)) {
		return nil, ErrForged
	}
	sent := time.UnixMilli(int64(binary.LittleEndian.Uint64(body[2:sealHeader])))
	if age := s.now().Sub(sent); age > MaxMessageAge || age < -MaxMessageAge {
		return nil, ErrStale
	}
	return body[sealHeader:], nil
}

// OpenDocument is Open without the age check, for a document kept in Redis (a rollout's state), which is as
// old as its last change.
func (s *Sealer) OpenDocument(key string, doc []byte) ([]byte, error) {
	if s == nil {
		return doc, nil
	}
	if len(doc) < sealHeader+sealMACBytes || doc[0] != sealMagic || doc[1] != sealVersion {
		return nil, ErrUnsigned
	}
	body, mac := doc[:len(doc)-sealMACBytes], doc[len(doc)-sealMACBytes:]
	if !hmac.Equal(mac, s.mac(key, body)) {
		return nil, ErrForged
	}
	return body[sealHeader:], nil
}

// Reason names why Open refused a message, for a result label: unsigned, forged or stale.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrUnsigned):
		return "unsigned"
	case errors.Is(err, ErrForged):
		return "forged"
	case errors.Is(err, ErrStale):
		return "stale"
	}
	return "malformed"
}

// mac is the HMAC of the channel and the sealed bytes before it.
func (s *Sealer) mac(channel string, sealed []byte) []byte {
	h := hmac.New(sha256.New, s.key)
	_, _ = io.WriteString(h, channel)
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(sealed)
	return h.Sum(nil)
}
