package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
)

// The audit log stands a digest in for the prompt and the output text. An unsalted SHA-256 of a short text is
// recovered by guessing ("yes", a name, an account number), so the digests are keyed: HMAC-SHA256 under a
// secret the platform holds, named in each record by an id derived from it, so that keys can rotate and a
// record still says which one it was made with. An auditor holding the key checks a text against a record
// with `infergate digest` (docs/security.md).

// MinKeyBytes is the shortest digest key accepted: the key, not the text, is what must not be guessed.
const MinKeyBytes = 32

// maxKeyFileBytes bounds the key file read.
const maxKeyFileBytes = 4096

// DigestKey keys the audit log's digests.
type DigestKey struct {
	// ID names the key in records: the first 8 bytes of the SHA-256 of the secret, in hex. It says which key
	// made a digest without helping anyone guess the key.
	ID     string
	secret []byte
	// digesters are keyed hashes to reuse: an HMAC costs about six allocations to set up, and every request
	// takes two digests (issue #40).
	digesters sync.Pool
}

// Digester is a keyed hash to reuse: Write the text, take its Hex, Release it.
type Digester struct {
	h   hash.Hash
	sum []byte
	key *DigestKey
}

// Write adds text to the digest.
func (d *Digester) Write(p []byte) (int, error) { return d.h.Write(p) }

// Hex is the digest of what was written, in hex.
func (d *Digester) Hex() string {
	d.sum = d.h.Sum(d.sum[:0])
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], d.sum)
	return string(out[:])
}

// Release hands the digester back for reuse; it must not be used after.
func (d *Digester) Release() {
	d.h.Reset()
	d.key.digesters.Put(d)
}

// Digester returns a digester under the key, empty.
func (k *DigestKey) Digester() *Digester {
	if d, ok := k.digesters.Get().(*Digester); ok {
		return d
	}
	return &Digester{h: hmac.New(sha256.New, k.secret), sum: make([]byte, 0, sha256.Size), key: k}
}

// NewDigestKey makes a key of secret, which must hold at least MinKeyBytes bytes.
func NewDigestKey(secret []byte) (*DigestKey, error) {
	if len(secret) < MinKeyBytes {
		return nil, fmt.Errorf("an audit digest key needs at least %d bytes, got %d", MinKeyBytes, len(secret))
	}
	sum := sha256.Sum256(secret)
	return &DigestKey{ID: hex.EncodeToString(sum[:8]), secret: bytes.Clone(secret)}, nil
}

// LoadDigestKey reads a key file (a mounted Secret): its bytes, less surrounding whitespace, are the secret.
func LoadDigestKey(path string) (*DigestKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("%s: over %d bytes; a digest key file holds the key alone", path, maxKeyFileBytes)
	}
	k, err := NewDigestKey(bytes.TrimSpace(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// EphemeralDigestKey is a random key for a process given none: its digests cannot be recovered by guessing,
// nor checked by anyone once the process ends.
func EphemeralDigestKey() *DigestKey {
	secret := make([]byte, MinKeyBytes)
	_, _ = rand.Read(secret) // crypto/rand.Read never fails
	k, _ := NewDigestKey(secret)
	return k
}

// New returns a hash that digests under the key (for a caller that keeps it; the request path reuses
// Digesters).
func (k *DigestKey) New() hash.Hash { return hmac.New(sha256.New, k.secret) }

// Digest is the hex digest of b under the key.
func (k *DigestKey) Digest(b []byte) string { return k.DigestYielding(b, nil) }

// digestSliceBytes is how much DigestYielding hashes between two yields: some tens of microseconds.
const digestSliceBytes = 64 << 10

// DigestYielding is Digest calling yield between slices of a long text (nil: never), so that a multi-megabyte
// prompt's digest, about 0.6 ms per MiB, gives way to other work as its parse does.
func (k *DigestKey) DigestYielding(b []byte, yield func()) string {
	d := k.Digester()
	for len(b) > digestSliceBytes && yield != nil {
		_, _ = d.Write(b[:digestSliceBytes])
		b = b[digestSliceBytes:]
		yield()
	}
	_, _ = d.Write(b)
	s := d.Hex()
	d.Release()
	return s
}
