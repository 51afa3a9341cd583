package capacity

import (
	"math"
	"os"
	"testing"
)

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*want {
		t.Errorf("%s = %.4g, want %.4g ±%.0f%%", what, got, want, 100*tol)
	}
}

// The KV and weight sizes of published configs (the reference table of llm-serving-facts §1.1).
func TestArchitectureArithmetic(t *testing.T) {
	for _, tc := range []struct {
		preset          string
		kvBF16, kvFP8   float64
		bf16, fp8, int4 float64 // weights, GB
	}{
		{"llama-3.1-8b", 131072, 65536, 16.1, 9.1, 5.7},
		{"llama-3.3-70b", 327680, 163840, 141.1, 72.7, 39.5},
		{"qwen2.5-32b", 262144, 131072, 65.0, 34.1, 19.1},
		{"qwen2.5-7b", 57344, 28672, 15.2, 8.7, 5.5},
		{"mixtral-8x7b", 131072, 65536, 93.4, 47.0, 24.5},
		{"deepseek-v3", 70272, 35136, 1342, 672.8, 349},
	} {
		a := Presets[tc.preset]
		kv, _ := a.KVBytesPerToken(BF16)
		kv8, _ := a.KVBytesPerToken(FP8)
		if kv != tc.kvBF16 || kv8 != tc.kvFP8 {
			t.Errorf("%s: KV %v / %v bytes per token, want %v / %v", tc.preset, kv, kv8, tc.kvBF16, tc.kvFP8)
		}
		for d, want := range map[Dtype]float64{BF16: tc.bf16, FP8: tc.fp8, INT4: tc.int4} {
			w, err := a.WeightBytes(d)
			if err != nil {
				t.Fatal(err)
			}
			within(t, tc.preset+" "+string(d)+" weights GB", w/1e9, want, 0.02)
		}
	}
	if _, err := Presets["llama-3.1-8b"].KVBytesPerToken("int4"); err == nil {
		t.Error("an INT4 KV cache was accepted")
	}
}

// A config.json gives the shape, and the parameter count from it, within a couple of percent of the
// published counts.
func TestParseHFConfig(t *testing.T) {
	for _, tc := range []struct {
		file           string
		params, active float64
		kv             float64
	}{
		{"llama-3.1-8b", 8.03e9, 8.03e9, 131072},
		{"qwen2.5-7b", 7.62e9, 7.62e9, 57344},
		{"mixtral-8x7b", 46.7e9, 12.9e9, 131072},
		{"qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, 2 * 24 * 16 * 128 * 2}, // routed and shared experts
	} {
		b, err := os.ReadFile("testdata/" + tc.file + ".config.json")
		if err != nil {
			t.Fatal(err)
		}
		a, err := ParseHFConfig(tc.file, b, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		within(t, tc.file+" parameters", a.Parameters, tc.params, 0.02)
		within(t, tc.file+" active parameters", a.ActiveParameters, tc.active, 0.02)
		if kv, _ := a.KVBytesPerToken(BF16); kv != tc.kv {
			t.Errorf("%s: KV %v bytes per token", tc.file, kv)
		}
	}
	for _, bad := range []string{`{"num_hidden_layers": 0, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 1}`,
		`{"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 10, "kv_lora_rank": 512, "qk_rope_head_dim": 64}`,
		`{"num_hidden_layers": 1e30}`, `[`} {
		if _, err := ParseHFConfig("bad", []byte(bad), 0, 0); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func FuzzParseHFConfig(f *testing.F) {
	for _, name := range []string{"llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b"} {
		b, _ := os.ReadFile("testdata/" + name + ".config.json")
		f.Add(b)
	}
	f.Add([]byte(`{"num_hidden_layers":61,"num_attention_heads":128,"hidden_size":7168,"vocab_size":129280,"kv_lora_rank":512,"qk_rope_head_dim":64,"n_routed_experts":256,"num_experts_per_tok":8}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseHFConfig("fuzz", b, 0, 0)
		if err != nil {
			return
		}
		kv, err := a.KVBytesPerToken(BF16)
		if err != nil || kv <= 0 || math.IsInf(kv, 0) || a.Parameters <= 0 || math.IsInf(a.Parameters, 0) || math.IsNaN(a.Parameters) {
			t.Fatalf("accepted config gives KV %v, parameters %v (%v)", kv, a.Parameters, err)
		}
	})
}
