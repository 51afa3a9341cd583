package fleet

import (
	"slices"
	"testing"
)

// Every registered engine name resolves to the dialect of that name, and nothing else resolves: no fall-back
// to vLLM for a name the registry does not hold.
func TestDialectRegistry(t *testing.T) {
	names := EngineNames()
	if want := []string{"vllm", "sglang", "trtllm"}; !slices.Equal(names, want) {
		t.Errorf("EngineNames() = %v, want %v", names, want)
	}
	if len(Dialects()) != len(names) {
		t.Errorf("%d dialects, %d names", len(Dialects()), len(names))
	}
	tests := []struct {
		engine string
		ok     bool
	}{
		{"tgi", false},
		{"", false},
		{"VLLM", false},
		{" vllm", false},
		{"ollama", false},
	}
	for _, n := range names {
		tests = append(tests, struct {
			engine string
			ok     bool
		}{n, true})
	}
	for _, tc := range tests {
		t.Run(tc.engine, func(t *testing.T) {
			d, ok := DialectFor(tc.engine)
			if ok != tc.ok {
				t.Fatalf("DialectFor(%q) ok = %v, want %v", tc.engine, ok, tc.ok)
			}
			if !ok {
				if d != nil {
					t.Errorf("DialectFor(%q) = %v with ok false, want nil", tc.engine, d)
				}
				return
			}
			if d.Name() != tc.engine {
				t.Errorf("DialectFor(%q).Name() = %q", tc.engine, d.Name())
			}
		})
	}
}

// Dialects hands out a copy: a caller cannot change which engines are known.
func TestDialectsIsACopy(t *testing.T) {
	ds := Dialects()
	ds[0] = nil
	if d, ok := DialectFor("vllm"); !ok || d == nil || Dialects()[0] == nil {
		t.Error("changing Dialects()'s slice changed the registry")
	}
}

func TestMustDialectPanicsOnUnknown(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MustDialect(\"tgi\") did not panic")
		}
	}()
	MustDialect("tgi")
}
