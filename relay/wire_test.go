package relay

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/fleet"
)

func TestEncodeDecode(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	in := []fleet.Reading{
		{Addr: "10.0.0.1:8000", Metrics: fleet.EngineMetrics{Running: 12, Waiting: 3, KVUtil: 0.42, BlockSize: 16, NumBlocks: 9000,
			LoRAs: []string{"sql"}, Version: "0.11.0", PromptTokens: 123456, CachedPromptTokens: 65432, At: now.Add(-30 * time.Millisecond)}},
		{Addr: "10.0.0.2:8000", Metrics: fleet.EngineMetrics{At: now}},
	}
	msg, err := encode("me", in, now)
	if err != nil {
		t.Fatal(err)
	}
	later := now.Add(time.Hour) // the receiver's clock: readings are dated by their age, not the sender's time
	origin, out, err := decode(msg, later)
	if err != nil {
		t.Fatal(err)
	}
	if origin != "me" || len(out) != 2 {
		t.Fatalf("decoded %q with %d readings", origin, len(out))
	}
	got, want := out[0].Metrics, in[0].Metrics
	if out[0].Addr != in[0].Addr || got.Running != want.Running || got.Waiting != want.Waiting || got.KVUtil != want.KVUtil ||
		got.BlockSize != want.BlockSize || got.NumBlocks != want.NumBlocks || !slices.Equal(got.LoRAs, want.LoRAs) || got.Version != want.Version ||
		got.PromptTokens != want.PromptTokens || got.CachedPromptTokens != want.CachedPromptTokens {
		t.Errorf("decoded %+v, want %+v", out[0], in[0])
	}
	if age := later.Sub(got.At); age != 30*time.Millisecond {
		t.Errorf("a reading 30ms old when sent is %v old at the receiver", age)
	}
}

func TestDecodeRejects(t *testing.T) {
	now := time.Now()
	tests := []struct{ name, msg string }{
		{"not JSON", "nope"},
		{"no origin", `{"readings":[]}`},
		{"no address", `{"origin":"x","readings":[{"running":1,"ageMs":0}]}`},
		{"negative running", `{"origin":"x","readings":[{"addr":"a","running":-1,"ageMs":0}]}`},
		{"KV above 1", `{"origin":"x","readings":[{"addr":"a","kvUtil":1.5,"ageMs":0}]}`},
		{"a negative age", `{"origin":"x","readings":[{"addr":"a","ageMs":-5}]}`},
		{"an age over a minute", `{"origin":"x","readings":[{"addr":"a","ageMs":600000}]}`},
		{"a negative prompt-token counter", `{"origin":"x","readings":[{"addr":"a","promptTokens":-1,"ageMs":0}]}`},
		{"a cached-token counter past 2^53", `{"origin":"x","readings":[{"addr":"a","cachedPromptTokens":1e300,"ageMs":0}]}`},
		{"a prompt-token counter just past 2^53", `{"origin":"x","readings":[{"addr":"a","promptTokens":9007199254740994,"ageMs":0}]}`},
		{"a huge block count", `{"origin":"x","readings":[{"addr":"a","numBlocks":99999999999,"ageMs":0}]}`},
		{"a long address", `{"origin":"x","readings":[{"addr":"` + strings.Repeat("a", 300) + `","ageMs":0}]}`},
		{"too large", `{"origin":"` + strings.Repeat("x", MaxMessageBytes) + `"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := decode([]byte(tc.msg), now); !errors.Is(err, ErrMalformed) {
				t.Errorf("decode = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzDecode: no message crashes the decoder, and what it accepts is within the bounds routing trusts.
func FuzzDecode(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	msg, _ := encode("o", []fleet.Reading{{Addr: "a:1", Metrics: fleet.EngineMetrics{Running: 1, KVUtil: 0.5, At: now}}}, now)
	f.Add(msg)
	f.Add([]byte(`{"origin":"x","readings":[{"addr":"a","running":1e308,"ageMs":0}]}`))
	f.Add([]byte(`{"origin":"x","readings":[{"addr":"a","promptTokens":1e16,"cachedPromptTokens":5,"ageMs":0}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, rs, err := decode(b, now)
		if err != nil {
			return
		}
		for _, r := range rs {
			m := r.Metrics
			if r.Addr == "" || m.Running < 0 || m.Waiting < 0 || m.KVUtil < 0 || m.KVUtil > 1 || m.At.After(now) || now.Sub(m.At) > maxAge ||
				m.PromptTokens < 0 || m.PromptTokens >= 1<<53 || m.CachedPromptTokens < 0 || m.CachedPromptTokens >= 1<<53 {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}
