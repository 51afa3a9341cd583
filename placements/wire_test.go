package placements

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			origin, got, err := Decode(Encode(testOrigin, tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if origin != testOrigin || got.Endpoint != tc.want.Endpoint || got.Capacity != tc.want.Capacity ||
				got.Forgotten != tc.want.Forgotten || !slices.Equal(got.Hashes, tc.want.Hashes) {
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Decode(tc.msg); !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzDecode: no message crashes the decoder or makes it allocate beyond its bounds, and whatever it accepts
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "10.0.0.1:8000", Hashes: []uint64{1, 2}, Capacity: 9}))
	f.Add(Encode(testOrigin, picker.Placement{Endpoint: "e", Hashes: []uint64{1}, Forgotten: true}))
	f.Add([]byte{wireVersion, 0})
	f.Fuzz(func(t *testing.T, msg []byte) {
		origin, pl, err := Decode(msg)
		if err != nil {
			return
		}
		if len(pl.Hashes) > picker.MaxSharedBlocks || len(pl.Endpoint) > MaxEndpointBytes || pl.Capacity > picker.MaxLearntCapacity {
			t.Fatalf("accepted beyond the bounds: %d hashes, %d-byte endpoint, capacity %d", len(pl.Hashes), len(pl.Endpoint), pl.Capacity)
		}
		if again := Encode(origin, pl); !bytes.Equal(again, msg) {
			// Varints have one shortest form; a longer one that decodes is still the same placement.
			o2, pl2, err := Decode(again)
			if err != nil || o2 != origin || pl2.Endpoint != pl.Endpoint || !slices.Equal(pl2.Hashes, pl.Hashes) ||
				pl2.Capacity != pl.Capacity || pl2.Forgotten != pl.Forgotten {
				t.Fatalf("re-encoding %x gave %x, which decodes to %+v, %v", msg, again, pl2, err)
			}
		}
	})
}
