package openai

import (
	"bytes"
	"testing"
)

// NextObject reads a valid array's elements as Next does and each object's members as a Member call per name
// does, in one walk: first values of duplicate keys, escaped keys decoded, non-objects passed whole, and a cut
// array ends the walk.
func TestNextObjectMatchesNextAndMember(t *testing.T) {
	names := []string{"role", "content", "tool_calls"}
	for name, arr := range map[string]string{
		"messages":       `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}],"tool_calls":[{"id":"1"}]}]`,
		"spaced":         "[ { \"role\" : \"user\" ,\n \"content\" : \"a b\" } , {} ]",
		"duplicate keys": `[{"role":"user","role":"system","content":"x","content":"y"}]`,
		"escaped key":    `[{"r\u006fle":"user","content":"x"}]`,
		"no role":        `[{"content":"x"},"plain",[1,2],3,null]`,
		"empty":          `[]`,
		"cut":            `[{"role":"user","content":"x"`,
		"cut in a key":   `[{"role":"user","cont`,
		"not an array":   `{"role":"user"}`,
	} {
		t.Run(name, func(t *testing.T) {
			want, got := Elements([]byte(arr)), Elements([]byte(arr))
			for n := 0; ; n++ {
				wantItem, wantOK := want.Next()
				var values [3][]byte
				item, isObject, ok := got.NextObject(names, values[:])
				if ok != wantOK || !bytes.Equal(item, wantItem) {
					t.Fatalf("element %d: %q, %v; Next gives %q, %v", n, item, ok, wantItem, wantOK)
				}
				if !ok {
					return
				}
				if isObject != (item[0] == '{') {
					t.Fatalf("element %d: isObject %v for %q", n, isObject, item)
				}
				for i, name := range names {
					if w := Member(item, name); isObject && !bytes.Equal(values[i], w) {
						t.Fatalf("element %d, %s: %q; Member gives %q", n, name, values[i], w)
					}
				}
			}
		})
	}
}

// Compact writes a string value whole, as it was written, escapes and spaces inside it included.
func TestCompactWritesAStringWhole(t *testing.T) {
	for _, v := range []string{`"a b\n\"c\""`, `"unterminated\"`, `""`} {
		var out []byte
		Compact([]byte(v), func(b []byte) { out = append(out, b...) })
		if string(out) != v {
			t.Errorf("Compact(%s) = %s", v, out)
		}
	}
	var out []byte
	Compact([]byte(`{ "a" : [ 1 , "b c" ] }`), func(b []byte) { out = append(out, b...) })
	if string(out) != `{"a":[1,"b c"]}` {
		t.Errorf("Compact of an object = %s", out)
	}
}
