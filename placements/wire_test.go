package placements

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/picker"
)

var testOrigin = Origin{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func TestEncodeDecode(t *testing.T) {
	many := make([]uint64, picker.MaxSharedBlocks+10)
	for i := range many {
		many[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	tests := []struct {
		name string
		in   picker.Placement
		want picker.Placement
	}{
		{"a placement", picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2, 1 << 63}, Capacity: 42000},
			picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2, 1 << 63}, Capacity: 42000}},
		{"a forgotten group", picker.Placement{Endpoint: "[::1]:9", Hashes: []uint64{7, 8}, Forgotten: true},
			picker.Placement{Endpoint: "[::1]:9", Hashes: []uint64{7, 8}, Forgotten: true}},
		{"more blocks than a message carries", picker.Placement{Endpoint: "e:1", Hashes: many},
			picker.Placement{Endpoint: "e:1", Hashes: many[:picker.MaxSharedBlocks]}},
		{"a negative capacity", picker.Placement{Endpoint: "e:1", Hashes: []uint64{3}, Capacity: -5},
			picker.Placement{Endpoint: "e:1", Hashes: []uint64{3}}},
		{"a long prompt sent", picker.Placement{Endpoint: "10.0.0.1:8000", Prefill: 30000, Due: 1500*time.Millisecond + 7, ID: 1<<63 + 5},
			picker.Placement{Endpoint: "10.0.0.1:8000", Prefill: 30000, Due: 1500 * time.Millisecond, ID: 1<<63 + 5}},
		{"a long prompt done", picker.Placement{Endpoint: "e:1", ID: 11, Done: true, Booked: true, Prefill: 0},
			picker.Placement{Endpoint: "e:1", ID: 11, Done: true}},
		{"a split's booking at its decoder", picker.Placement{Endpoint: "e:1", Prefill: 9000, Due: time.Second, ID: 3, Booked: true},
			picker.Placement{Endpoint: "e:1", Prefill: 9000, Due: time.Second, ID: 3, Booked: true}},
		{"a long prompt past the bounds", picker.Placement{Endpoint: "e:1", Prefill: 1 << 30, Due: time.Hour, ID: 1},
			picker.Placement{Endpoint: "e:1", Prefill: picker.MaxPublishedPrefill, Due: picker.MaxPrefillDue, ID: 1}},
		{"a long prompt due at once", picker.Placement{Endpoint: "e:1", Prefill: 9, Due: -time.Second, ID: 2},
			picker.Placement{Endpoint: "e:1", Prefill: 9, ID: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			origin, got, err := Decode(Encode(testOrigin, tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if origin != testOrigin || got.Endpoint != tc.want.Endpoint || got.Capacity != tc.want.Capacity ||
				got.Forgotten != tc.want.Forgotten || !slices.Equal(got.Hashes, tc.want.Hashes) ||
				got.Prefill != tc.want.Prefill || got.Due != tc.want.Due || got.ID != tc.want.ID || got.Booked != tc.want.Booked || got.Done != tc.want.Done {
				t.Errorf("decoded %v %+v, want %v %+v", origin, got, testOrigin, tc.want)
			}
		})
	}
	if n := len(Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: many})); n > 2200 {
		t.Errorf("a full message is %d bytes, more than the 2.2 KB MaxSharedBlocks promises", n)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2}})
	header := append([]byte{wireVersion, 0}, testOrigin[:]...)
	tests := []struct {
		name string
		msg  []byte
	}{
		{"empty", nil},
		{"short of an origin", good[:10]},
		{"another version", append([]byte{2}, good[1:]...)},
		{"unknown flags", append([]byte{wireVersion, 0x80}, good[2:]...)},
		{"no endpoint", append(bytes.Clone(header), 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0)},
		{"an endpoint longer than its field", append(bytes.Clone(header), 0, 40, 'a')},
		{"an endpoint over the bound", append(append(bytes.Clone(header), 0, 0x81, 0x02), strings.Repeat("a", 257)...)},
		{"no hashes", append(bytes.Clone(header), 0, 1, 'a', 0)},
		{"more hashes than carried", good[:len(good)-1]},
		{"trailing bytes", append(bytes.Clone(good), 0)},
		{"a hash count over the bound", binary.AppendUvarint(append(bytes.Clone(header), 0, 1, 'a'), picker.MaxSharedBlocks+1)},
		{"a capacity over the bound", binary.AppendUvarint(bytes.Clone(header), picker.MaxLearntCapacity+1)},
		{"a truncated varint", append(bytes.Clone(header), 0xff)},
		{"a long prompt of no tokens", prefillMsg(0, 10, "e:1")},
		{"a long prompt over the token bound", prefillMsg(picker.MaxPublishedPrefill+1, 10, "e:1")},
		{"a long prompt due past the bound", prefillMsg(1, uint64(picker.MaxPrefillDue.Milliseconds())+1, "e:1")},
		{"a long prompt with no endpoint", prefillMsg(1, 10, "")},
		{"a long prompt with trailing bytes", append(prefillMsg(1, 10, "e:1"), 0)},
		{"a long prompt truncated", prefillMsg(1, 10, "e:1")[:2+OriginBytes+10]},
		{"a long prompt of id 0", Encode(testOrigin, picker.Placement{Endpoint: "e:1", Prefill: 5, Due: time.Second})},
		{"a long prompt short of its id", prefillMsg(1, 10, "e:1")[:2+OriginBytes+7]},
		{"a long prompt with hashes' flags", append([]byte{wireVersion, flagPrefill | flagForgotten}, prefillMsg(1, 10, "e:1")[2:]...)},
		{"a long prompt done, with tokens", append([]byte{wireVersion, flagPrefill | flagDone}, prefillMsg(1, 10, "e:1")[2:]...)},
		{"a long prompt done and booked", append([]byte{wireVersion, flagPrefill | flagDone | flagBooked}, Encode(testOrigin, picker.Placement{Endpoint: "e:1", ID: 1, Done: true})[2:]...)},
		{"a long prompt done, no endpoint", Encode(testOrigin, picker.Placement{Endpoint: "e:1", ID: 1, Done: true})[:2+OriginBytes+8]},
		{"a booking without a long prompt", append([]byte{wireVersion, flagBooked}, prefillMsg(1, 10, "e:1")[2:]...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Decode(tc.msg); !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

// prefillMsg is a long prompt's message, its fields as given (id 7).
func prefillMsg(tokens, dueMillis uint64, ep string) []byte {
	b := binary.LittleEndian.AppendUint64(append([]byte{wireVersion, flagPrefill}, testOrigin[:]...), 7)
	b = binary.AppendUvarint(binary.AppendUvarint(b, tokens), dueMillis)
	return append(binary.AppendUvarint(b, uint64(len(ep))), ep...)
}

// FuzzDecode: no message crashes the decoder or makes it allocate beyond its bounds, and whatever it accepts
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2}, Capacity: 9}))
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e", Hashes: []uint64{1}, Forgotten: true}))
	f.Add([]byte{wireVersion, 0})
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Prefill: 30000, Due: time.Second, ID: 9}))
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e", Prefill: 1, Due: time.Minute, ID: 1, Booked: true}))
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e:1", ID: 1, Done: true}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		origin, pl, err := Decode(msg)
		if err != nil {
			return
		}
		if len(pl.Hashes) > picker.MaxSharedBlocks || len(pl.Endpoint) > MaxEndpointBytes || pl.Capacity > picker.MaxLearntCapacity ||
			pl.Prefill > picker.MaxPublishedPrefill || pl.Due > picker.MaxPrefillDue || pl.Due < 0 {
			t.Fatalf("accepted beyond the bounds: %d hashes, %d-byte endpoint, capacity %d, prefill %d due %v",
				len(pl.Hashes), len(pl.Endpoint), pl.Capacity, pl.Prefill, pl.Due)
		}
		if again := Encode(origin, pl); !bytes.Equal(again, msg) {
			// Varints have one shortest form; a longer one that decodes is still the same placement.
			o2, pl2, err := Decode(again)
			if err != nil || o2 != origin || pl2.Endpoint != pl.Endpoint || !slices.Equal(pl2.Hashes, pl.Hashes) ||
				pl2.Capacity != pl.Capacity || pl2.Forgotten != pl.Forgotten || pl2.Prefill != pl.Prefill || pl2.Due != pl.Due ||
				pl2.ID != pl.ID || pl2.Booked != pl.Booked || pl2.Done != pl.Done {
				t.Fatalf("re-encoding %x gave %x, which decodes to %+v, %v", msg, again, pl2, err)
			}
		}
	})
}

func TestChurnEncodeDecode(t *testing.T) {
	blocks := map[string]int{"10.0.0.2:8000": 7, "10.0.0.1:8000": 1 << 30, "": 4, "zero:1": 0, strings.Repeat("a", 300): 2}
	msgs := EncodeChurn(testOrigin, blocks)
	if len(msgs) != 1 {
		t.Fatalf("%d messages for two endpoints, want 1", len(msgs))
	}
	origin, got, err := DecodeMessage(msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []picker.Placement{{Endpoint: "10.0.0.1:8000", Churn: picker.MaxLearntCapacity}, {Endpoint: "10.0.0.2:8000", Churn: 7}}
	same := len(got) == len(want)
	for i := range min(len(got), len(want)) {
		same = same && got[i].Endpoint == want[i].Endpoint && got[i].Churn == want[i].Churn && got[i].Hashes == nil
	}
	if origin != testOrigin || !same {
		t.Errorf("decoded %v %+v, want %+v (sorted, bounded, without the empty, zero and overlong entries)", origin, got, want)
	}
	many := map[string]int{}
	for i := range MaxChurnEntries + 5 {
		many[fmt.Sprintf("10.1.%d.%d:1", i/256, i%256)] = i + 1
	}
	msgs = EncodeChurn(testOrigin, many)
	total := 0
	for _, msg := range msgs {
		_, pls, err := DecodeMessage(msg)
		if err != nil {
			t.Fatal(err)
		}
		total += len(pls)
	}
	if len(msgs) != 2 || total != len(many) {
		t.Errorf("%d endpoints went in %d messages carrying %d, want 2 carrying all", len(many), len(msgs), total)
	}
	if EncodeChurn(testOrigin, nil) != nil {
		t.Error("an empty report made a message")
	}
	// A placement reads as one.
	_, pls, err := DecodeMessage(Encode(testOrigin, picker.Placement{Endpoint: "e:1", Hashes: []uint64{5}}))
	if err != nil || len(pls) != 1 || pls[0].Endpoint != "e:1" || !slices.Equal(pls[0].Hashes, []uint64{5}) {
		t.Errorf("a placement decoded to %+v, %v", pls, err)
	}
}

func TestDecodeChurnRejects(t *testing.T) {
	header := append([]byte{wireVersion, flagChurn}, testOrigin[:]...)
	entry := func(b []byte, ep string, n uint64) []byte {
		b = binary.AppendUvarint(b, uint64(len(ep)))
		return binary.AppendUvarint(append(b, ep...), n)
	}
	good := entry(binary.AppendUvarint(bytes.Clone(header), 1), "e:1", 3)
	tests := []struct {
		name string
		msg  []byte
	}{
		{"short of an origin", header[:8]},
		{"another version", append([]byte{9}, good[1:]...)},
		{"no entries", binary.AppendUvarint(bytes.Clone(header), 0)},
		{"more entries than the bound", binary.AppendUvarint(bytes.Clone(header), MaxChurnEntries+1)},
		{"more entries than bytes", binary.AppendUvarint(bytes.Clone(header), 100)},
		{"an empty endpoint", entry(binary.AppendUvarint(bytes.Clone(header), 1), "", 3)},
		{"zero blocks", entry(binary.AppendUvarint(bytes.Clone(header), 1), "e:1", 0)},
		{"blocks over the bound", entry(binary.AppendUvarint(bytes.Clone(header), 1), "e:1", picker.MaxLearntCapacity+1)},
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(bytes.Clone(good), 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := DecodeMessage(tc.msg); !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeMessage = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzDecodeMessage: no message of either kind crashes the decoder or passes its bounds, and a churn report
// it accepts encodes back to the same entries.
func FuzzDecodeMessage(f *testing.F) {
	for _, msg := range EncodeChurn(testOrigin, map[string]int{"10.0.0.1:8000": 40, "e": 1}) {
		f.Add(msg)
	}
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2}, Capacity: 9}))
	f.Add([]byte{wireVersion, flagChurn})
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e", Prefill: 9000, Due: 2 * time.Second, ID: 3}))
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e", ID: 4, Done: true}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		origin, pls, err := DecodeMessage(msg)
		if err != nil {
			return
		}
		blocks := map[string]int{}
		for _, pl := range pls {
			if len(pl.Endpoint) > MaxEndpointBytes || pl.Churn > picker.MaxLearntCapacity || len(pl.Hashes) > picker.MaxSharedBlocks ||
				pl.Prefill > picker.MaxPublishedPrefill || pl.Due > picker.MaxPrefillDue || pl.Due < 0 {
				t.Fatalf("accepted beyond the bounds: %+v", pl)
			}
			if pl.Churn > 0 {
				blocks[pl.Endpoint] += pl.Churn
			}
		}
		if len(blocks) == 0 || len(blocks) != len(pls) {
			return // a placement (FuzzDecode covers it), or a report naming an endpoint twice
		}
		again := EncodeChurn(origin, blocks)
		if len(again) != 1 {
			t.Fatalf("%d entries re-encoded to %d messages", len(blocks), len(again))
		}
		_, pls2, err := DecodeMessage(again[0])
		if err != nil || len(pls2) != len(pls) {
			t.Fatalf("re-encoding gave %+v, %v", pls2, err)
		}
		for _, pl := range pls2 {
			if blocks[pl.Endpoint] != pl.Churn {
				t.Fatalf("re-encoded %s with %d blocks, want %d", pl.Endpoint, pl.Churn, blocks[pl.Endpoint])
			}
		}
	})
}
