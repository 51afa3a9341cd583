// Package placements shares the picker's placements between gateway replicas over Redis pub/sub: each replica
// publishes where it started a conversation group (or found one evicted), and every other replica credits it
// to its own prefix index (picker.Affinity.Learn); under SLO placement it also publishes the long prompts it
// sends, which the others count in the endpoint's prefill ahead. Messages flow only when a group gets a new
// copy or a prompt takes long to prefill, not per request, so the cost grows with the traffic's new groups and
// the fleet's prefill, and never adds a round trip to a decision.
package placements

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/infergate/infergate/picker"
)

// Channel is the Redis pub/sub channel every gateway replica publishes to and subscribes on.
const Channel = "infergate:placements:v1"

// wireVersion is the first byte of every message; a receiver drops versions it does not know.
const wireVersion = 1

// OriginBytes is the length of a replica's origin: random per process, so that a replica skips its own
// messages, which Redis delivers back to it.
const OriginBytes = 16

// MaxEndpointBytes bounds an endpoint's address in a message (host:port, or a fallback's cluster name).
const MaxEndpointBytes = 256

const (
	flagForgotten = 1
	// flagChurn marks a churn report: endpoints and block counts (picker.Placement.Churn) in place of one
	// endpoint's hashes.
	flagChurn = 2
	// flagPrefill marks a long prompt sent (picker.Placement.Prefill): its id, uncached tokens and due time in
	// milliseconds in place of the capacity and hashes; with flagBooked, a split's booking at its decoder.
	flagPrefill = 4
	flagBooked  = 8
	// flagDone, with flagPrefill, reports a long prompt's first token out (picker.Placement.Done): its id and
	// endpoint only.
	flagDone = 16
)

// MaxChurnEntries bounds the endpoints of one churn report; a replica with more sends several.
const MaxChurnEntries = 4096

// Origin names the replica a message came from.
type Origin [OriginBytes]byte

// ErrMalformed is any message that is not a placement this version can read.
var ErrMalformed = errors.New("malformed placement message")

// Encode writes a placement: version, flags, origin, capacity, endpoint, block hashes (little-endian); or, for
// a long prompt sent (Prefill set, no hashes; Forgotten does not apply), version, flags, origin, id
// (little-endian), tokens, due milliseconds, endpoint; for one done (Done set), version, flags, origin, id,
// endpoint.
func Encode(origin Origin, pl picker.Placement) []byte {
	if (pl.Prefill > 0 || pl.Done) && len(pl.Hashes) == 0 {
		return encodePrefill(origin, pl)
	}
	hashes := pl.Hashes[:min(len(pl.Hashes), picker.MaxSharedBlocks)]
	ep := pl.Endpoint[:min(len(pl.Endpoint), MaxEndpointBytes)]
	b := make([]byte, 0, 2+OriginBytes+3*binary.MaxVarintLen64+len(ep)+8*len(hashes))
	var flags byte
	if pl.Forgotten {
		flags |= flagForgotten
	}
	b = append(b, wireVersion, flags)
	b = append(b, origin[:]...)
	b = binary.AppendUvarint(b, uint64(max(0, pl.Capacity)))
	b = binary.AppendUvarint(b, uint64(len(ep)))
	b = append(b, ep...)
	b = binary.AppendUvarint(b, uint64(len(hashes)))
	for _, h := range hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// encodePrefill writes a long prompt sent (see Encode).
func encodePrefill(origin Origin, pl picker.Placement) []byte {
	ep := pl.Endpoint[:min(len(pl.Endpoint), MaxEndpointBytes)]
	b := make([]byte, 0, 2+OriginBytes+8+3*binary.MaxVarintLen64+len(ep))
	flags := byte(flagPrefill)
	switch {
	case pl.Done:
		flags |= flagDone
	case pl.Booked:
		flags |= flagBooked
	}
	b = append(b, wireVersion, flags)
	b = append(b, origin[:]...)
	b = binary.LittleEndian.AppendUint64(b, pl.ID)
	if !pl.Done {
		b = binary.AppendUvarint(b, uint64(min(pl.Prefill, picker.MaxPublishedPrefill)))
		b = binary.AppendUvarint(b, uint64(min(max(0, pl.Due), picker.MaxPrefillDue).Milliseconds()))
	}
	b = binary.AppendUvarint(b, uint64(len(ep)))
	return append(b, ep...)
}

// Decode reads a message Encode wrote. Every length is bounded before anything is allocated, and the
// message must end where its hashes (or its endpoint, for a long prompt sent) do.
func Decode(b []byte) (Origin, picker.Placement, error) {
	var origin Origin
	var pl picker.Placement
	if len(b) < 2+OriginBytes {
		return origin, pl, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != wireVersion {
		return origin, pl, fmt.Errorf("%w: version %d", ErrMalformed, b[0])
	}
	if b[1]&^flagBooked == flagPrefill || b[1] == flagPrefill|flagDone {
		return decodePrefill(b)
	}
	if b[1]&^flagForgotten != 0 {
		return origin, pl, fmt.Errorf("%w: flags %#x", ErrMalformed, b[1])
	}
	pl.Forgotten = b[1]&flagForgotten != 0
	copy(origin[:], b[2:2+OriginBytes])
	rest := b[2+OriginBytes:]
	capacity, rest, err := uvarint(rest, picker.MaxLearntCapacity)
	if err != nil {
		return origin, pl, fmt.Errorf("capacity: %w", err)
	}
	pl.Capacity = int(capacity)
	n, rest, err := uvarint(rest, MaxEndpointBytes)
	if err != nil || n == 0 || uint64(len(rest)) < n {
		return origin, pl, fmt.Errorf("%w: endpoint", ErrMalformed)
	}
	pl.Endpoint, rest = string(rest[:n]), rest[n:]
	count, rest, err := uvarint(rest, picker.MaxSharedBlocks)
	if err != nil || count == 0 || uint64(len(rest)) != 8*count {
		return origin, pl, fmt.Errorf("%w: block hashes", ErrMalformed)
	}
	pl.Hashes = make([]uint64, count)
	for i := range pl.Hashes {
		pl.Hashes[i] = binary.LittleEndian.Uint64(rest[8*i:])
	}
	return origin, pl, nil
}

// decodePrefill reads a long prompt sent (see Encode), its version and flags checked.
func decodePrefill(b []byte) (Origin, picker.Placement, error) {
	var origin Origin
	var pl picker.Placement
	copy(origin[:], b[2:2+OriginBytes])
	rest := b[2+OriginBytes:]
	if len(rest) < 8 {
		return origin, pl, fmt.Errorf("%w: prefill id", ErrMalformed)
	}
	pl.ID, pl.Booked, pl.Done = binary.LittleEndian.Uint64(rest), b[1]&flagBooked != 0, b[1]&flagDone != 0
	if pl.ID == 0 { // senders never use 0, and every 0 would read as a replay of the others
		return origin, pl, fmt.Errorf("%w: prefill id 0", ErrMalformed)
	}
	rest = rest[8:]
	if pl.Done {
		return origin, pl, readEndpoint(rest, &pl)
	}
	tokens, rest, err := uvarint(rest, picker.MaxPublishedPrefill)
	if err != nil || tokens == 0 {
		return origin, pl, fmt.Errorf("%w: prefill tokens", ErrMalformed)
	}
	due, rest, err := uvarint(rest, uint64(picker.MaxPrefillDue.Milliseconds()))
	if err != nil {
		return origin, pl, fmt.Errorf("prefill due: %w", err)
	}
	pl.Prefill, pl.Due = int(tokens), time.Duration(due)*time.Millisecond
	return origin, pl, readEndpoint(rest, &pl)
}

// readEndpoint reads a long prompt's endpoint, which must end the message.
func readEndpoint(b []byte, pl *picker.Placement) error {
	n, rest, err := uvarint(b, MaxEndpointBytes)
	if err != nil || n == 0 || uint64(len(rest)) != n {
		return fmt.Errorf("%w: endpoint", ErrMalformed)
	}
	pl.Endpoint = string(rest)
	return nil
}

// EncodeChurn writes a replica's churn report, blocks added per endpoint, as messages of at most
// MaxChurnEntries endpoints each (in endpoint order): version, flags, origin, entry count, then per entry the
// endpoint and its block count. Endpoints longer than MaxEndpointBytes and counts under 1 are left out.
func EncodeChurn(origin Origin, blocks map[string]int) [][]byte {
	eps := make([]string, 0, len(blocks))
	for ep, n := range blocks {
		if n > 0 && ep != "" && len(ep) <= MaxEndpointBytes {
			eps = append(eps, ep)
		}
	}
	slices.Sort(eps)
	var msgs [][]byte
	for len(eps) > 0 {
		part := eps[:min(len(eps), MaxChurnEntries)]
		eps = eps[len(part):]
		b := append([]byte{wireVersion, flagChurn}, origin[:]...)
		b = binary.AppendUvarint(b, uint64(len(part)))
		for _, ep := range part {
			b = binary.AppendUvarint(b, uint64(len(ep)))
			b = append(b, ep...)
			b = binary.AppendUvarint(b, uint64(min(blocks[ep], picker.MaxLearntCapacity)))
		}
		msgs = append(msgs, b)
	}
	return msgs
}

// DecodeMessage reads any kind of message: a placement or a long prompt sent, or a churn report as one Placement
// (Churn set) per endpoint. Like Decode, it bounds every length before allocating.
func DecodeMessage(b []byte) (Origin, []picker.Placement, error) {
	if len(b) < 2 || b[1] != flagChurn {
		origin, pl, err := Decode(b)
		if err != nil {
			return origin, nil, err
		}
		return origin, []picker.Placement{pl}, nil
	}
	var origin Origin
	if len(b) < 2+OriginBytes || b[0] != wireVersion {
		return origin, nil, fmt.Errorf("%w: churn header", ErrMalformed)
	}
	copy(origin[:], b[2:2+OriginBytes])
	rest := b[2+OriginBytes:]
	n, rest, err := uvarint(rest, MaxChurnEntries)
	if err != nil || n == 0 {
		return origin, nil, fmt.Errorf("%w: churn entries", ErrMalformed)
	}
	// Each entry takes at least three bytes, so the count cannot ask for more than the message holds.
	if n > uint64(len(rest))/3 {
		return origin, nil, fmt.Errorf("%w: %d churn entries in %d bytes", ErrMalformed, n, len(rest))
	}
	out := make([]picker.Placement, 0, n)
	for range n {
		size, r, err := uvarint(rest, MaxEndpointBytes)
		if err != nil || size == 0 || uint64(len(r)) < size {
			return origin, nil, fmt.Errorf("%w: churn endpoint", ErrMalformed)
		}
		ep := string(r[:size])
		blocks, r, err := uvarint(r[size:], picker.MaxLearntCapacity)
		if err != nil || blocks == 0 {
			return origin, nil, fmt.Errorf("%w: churn blocks", ErrMalformed)
		}
		out, rest = append(out, picker.Placement{Endpoint: ep, Churn: int(blocks)}), r
	}
	if len(rest) != 0 {
		return origin, nil, fmt.Errorf("%w: %d bytes after the churn entries", ErrMalformed, len(rest))
	}
	return origin, out, nil
}

// uvarint reads one bounded unsigned varint.
func uvarint(b []byte, limit uint64) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	if n <= 0 || v > limit {
		return 0, nil, fmt.Errorf("%w: length field", ErrMalformed)
	}
	return v, b[n:], nil
}
