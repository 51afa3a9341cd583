package openai

import (
	"encoding/json"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

// Hostile bodies get a 400 naming the problem, without a recursive parser ever seeing them.
func TestParseRequestRefusesHostileJSON(t *testing.T) {
	deep := func(n int) string {
		return `{"model":"m","messages":` + strings.Repeat("[", n)
	}
	nested := func(n int) string { // well-formed but too deep
		return `{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`{"a":`, n) + `1` +
			strings.Repeat("}", n) + `}]}`
	}
	tests := []struct {
		name, body, wantErr string
	}{
		{"two million brackets", deep(2_000_000), "nesting deeper than 128"},
		{"twenty thousand brackets", deep(20_000), "nesting deeper than 128"},
		{"deep but closed objects", nested(200), "nesting deeper than 128"},
		{"raw control character before an escape", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01b\\n\"}]}", "control character 0x01"},
		{"raw control character in a key", "{\"mo\x02del\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\t\"}]}", "control character 0x02"},
		{"raw newline in a string", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", "control character 0x0A"},
		{"unterminated string", `{"model":"m","messages":[{"role":"user","content":"abc`, "unterminated string"},
		{"escape at the very end", `{"model":"m","messages":"\`, "unterminated string"},
		{"duplicate model", `{"model":"a","messages":[{"role":"user","content":"x"}],"model":"b"}`, "repeats the key 'model'"},
		{"duplicate messages", `{"model":"a","messages":[{"role":"user","content":"x"}],"messages":[]}`, "repeats the key 'messages'"},
		{"duplicate stream", `{"model":"a","messages":[{"role":"user","content":"x"}],"stream":false,"stream":true}`, "repeats the key 'stream'"},
		{"duplicate max_tokens", `{"model":"a","messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_tokens":99999}`, "repeats the key 'max_tokens'"},
		{"a 4 MiB number", `{"model":"m","messages":[{"role":"user","content":"x"}],"seed":1` + strings.Repeat("0", 4<<20) + `}`, "a number longer than 1024 bytes"},
		{"a long fraction in an ignored array", `{"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[0.` + strings.Repeat("5", 1100) + `]}`, "a number longer than 1024 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := ParseRequest(EndpointChat, []byte(tc.body))
			req.Release()
			e, ok := err.(*Error)
			if !ok || e.Status != 400 {
				t.Fatalf("err = %v, want a 400 *Error", err)
			}
			if !strings.Contains(e.Message, tc.wantErr) {
				t.Errorf("message %q does not say %q", e.Message, tc.wantErr)
			}
			if len(e.Message) > 400 {
				t.Errorf("message is %d bytes; it must not quote the body", len(e.Message))
			}
		})
	}
}

// Bodies real clients send still parse: nesting up to the bound, escapes, keys repeated where routing does
// not read them, and UTF-8.
func TestParseRequestAcceptsOrdinaryJSON(t *testing.T) {
	bodies := []string{
		`{"model":"m","messages":[{"role":"user","content":` + strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat("}", 100) + `}]}`,
		`{"model":"m","messages":[{"role":"user","content":"tab\tescaped\\t \"quoted\" \u00e9 é \\\\"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x","name":"a","name":"b"}],"temperature":1,"temperature":2}`,
		`{"model":"m","messages":[{"role":"user","content":"[[[{{{"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"\/ \b \f \r \uABCD \u00e9"}],"temperature":-0.5e+3,"top_p":0,"seed":1E2,"n":null,"logprobs":false,"echo":true}`,
	}
	for _, b := range bodies {
		b = strings.ReplaceAll(b, "\t", `\t`) // a literal tab in Go source is a raw control character in JSON
		req, err := ParseRequest(EndpointChat, []byte(b))
		if err != nil {
			t.Errorf("%.60q: %v", b, err)
		}
		req.Release()
	}
}

func TestRewriteInjectsMaxTokens(t *testing.T) {
	req, err := ParseRequest(EndpointChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	out := req.Rewrite(nil, Edits{MaxTokens: 256, IncludeUsage: true})
	req.Release()
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["max_tokens"] != float64(256) {
		t.Errorf("max_tokens = %v in %s", doc["max_tokens"], out)
	}
	again, err := ParseRequest(EndpointChat, out)
	defer again.Release()
	if err != nil || again.MaxTokens != 256 {
		t.Errorf("rewritten body reads back max_tokens %d, %v", again.MaxTokens, err)
	}
}

func TestUsageArithmeticSaturates(t *testing.T) {
	u := Usage{PromptTokens: math.MaxInt64 - 1, CompletionTokens: math.MaxInt64 - 1}
	if got := u.Total(); got != math.MaxInt64 {
		t.Errorf("Total = %d, want saturation", got)
	}
	c, cut := u.Clamp(131072, 1)
	if !cut || c.PromptTokens != 131072 || c.CompletionTokens != 131072 {
		t.Errorf("Clamp = %+v, %v", c, cut)
	}
	if _, cut := (Usage{PromptTokens: 5, CompletionTokens: 7}).Clamp(10, 1); cut {
		t.Error("Clamp cut a usage within the limit")
	}
	// n sequences may each use the context's worth of output; no more, and no overflow on a hostile n.
	if c, cut := (Usage{PromptTokens: 5, CompletionTokens: 35}).Clamp(10, 4); cut || c.CompletionTokens != 35 {
		t.Errorf("Clamp cut four sequences' output within their bound: %+v", c)
	}
	if c, cut := (Usage{CompletionTokens: 50}).Clamp(10, 4); !cut || c.CompletionTokens != 40 {
		t.Errorf("Clamp of four sequences = %+v, %v, want 40", c, cut)
	}
	if c, _ := (Usage{CompletionTokens: math.MaxInt64}).Clamp(math.MaxInt64/2, 3); c.CompletionTokens != math.MaxInt64/2 {
		t.Errorf("Clamp with an overflowing bound = %+v, want the single bound", c)
	}
}

func BenchmarkPreScan(b *testing.B) {
	// Prompt text as chat clients send it: lines of prose, an escaped newline after each, now and then a quote.
	line := `You are a careful assistant. Answer the question below using only the \"context\" given.\n`
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat(line, 400) + `"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := preScan(body, MaxJSONDepth); err != nil {
			b.Fatal(err)
		}
	}
}

// The eight-bytes-at-once test agrees with the byte table on every byte value in every position.
func TestSpecial8MatchesTheTable(t *testing.T) {
	for c := range 256 {
		for pos := range 8 {
			word := []byte("abcdefgh")
			word[pos] = byte(c)
			v := uint64(0)
			for i := 7; i >= 0; i-- {
				v = v<<8 | uint64(word[i])
			}
			if got, want := special8(v), stringSpecial[byte(c)]; got != want {
				t.Fatalf("byte 0x%02X at %d: special8 %v, table %v", c, pos, got, want)
			}
		}
	}
}

// A body that does not parse gets a short reason with where it went wrong, not the parser's chain.
func TestMalformedJSONIsDescribedBriefly(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m",`:                        "ends too early",
		`{"model":"m","messages":[{}]} x`:      "offset",
		`{"model":"m" "messages":[]}`:          "invalid character '\"' after object key:value pair at offset 13",
		`{"model":"m","messages":[{"role":}]}`: "offset 33",
		`{"model":"m","max_tokens":01}`:        "offset",
		// What the parser leaves to the scan (scan.go): escapes, numbers and literals.
		`{"model":"m","messages":"\x"}`:        "escape",
		`{"model":"m","messages":"\u12g4"}`:    "escape",
		`{"model":"m","max_tokens":1.5.3}`:     "offset",
		`{"model":"m","max_tokens":1.}`:        "offset",
		`{"model":"m","max_tokens":.5}`:        "offset",
		`{"model":"m","max_tokens":+1}`:        "offset",
		`{"model":"m","max_tokens":1e}`:        "offset",
		`{"model":"m","max_tokens":NaN}`:       "offset",
		`{"model":"m","max_tokens":-Infinity}`: "offset",
		`{"model":"m","stream":tru}`:           "offset",
		`{"model":"m","stream":truex}`:         "offset",
		`{"model":"m","messages":[],"n":nul}`:  "offset",
		`{"model":"m","messages":[1true]}`:     "offset",
	} {
		_, err := ParseRequest(EndpointChat, []byte(body))
		e, ok := err.(*Error)
		if !ok || !strings.Contains(e.Message, want) || strings.Contains(e.Message, "cannot parse object") {
			t.Errorf("%s: %v, want a message with %q", body, err, want)
		}
	}
}

// Parsing a body costs memory for the fields routing reads, never per JSON value: a 4 MiB body with two million
// elements in a field the gateway ignores, or a million empty messages, allocates a few hundred bytes. (Parsed
// into a tree, the first cost about 0.9 GB of heap.)
func TestParsingAllocatesNothingPerElement(t *testing.T) {
	ignored := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":[` +
		strings.Repeat("0,", 2_000_000) + `0]}`)
	messages := []byte(`{"model":"m","messages":[` + strings.Repeat("{},", 1_000_000) + `{"role":"user","content":"hi"}]}`)
	for name, body := range map[string][]byte{"ignored array": ignored, "million messages": messages} {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			req, err := ParseRequest(EndpointChat, body)
			if err != nil {
				t.Fatal(err)
			}
			_ = req.ConversationKey()
			_ = req.Rewrite(make([]byte, 0, len(body)+64), Edits{Model: "renamed", IncludeUsage: true, MaxTokens: 9})
			runtime.ReadMemStats(&after)
			// The rewrite's buffer is the caller's; everything else must be small.
			if grew := after.TotalAlloc - before.TotalAlloc - uint64(len(body)+64); grew > 64<<10 {
				t.Errorf("parsing a %d-byte body allocated %d bytes beyond its rewrite", len(body), grew)
			}
		})
	}
}

// A large body's scan yields about every yieldEvery bytes, from its start and inside long strings; an ordinary
// body's never does.
func TestLargeBodiesYieldWhileScanned(t *testing.T) {
	text := func(n int) []byte {
		head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
	}
	elements := func(n int) []byte {
		head, tail := `{"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":[`, `0]}`
		return []byte(head + strings.Repeat("0,", (n-len(head)-len(tail))/2) + tail)
	}
	escaped := func(n int) []byte {
		head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
		return []byte(head + strings.Repeat(`ab\n`, (n-len(head)-len(tail))/4) + tail)
	}
	for _, tc := range []struct {
		name     string
		body     []byte
		min, max int
	}{
		{"2 KiB of text", text(2 << 10), 0, 0},
		{"64 KiB of text", text(LargeBodyBytes), 0, 0},
		{"64 KiB of elements", elements(LargeBodyBytes), 0, 0},
		{"64 KiB and a byte of text", text(LargeBodyBytes + 1), 7, 9},
		{"4 MiB of text", text(4 << 20), 511, 513},
		{"4 MiB of elements", elements(4 << 20), 511, 513},
		{"4 MiB of escaped lines", escaped(4 << 20), 511, 513},
		{"4 MiB of whitespace", []byte(`{` + strings.Repeat(" ", 4<<20) + `"model":"m","messages":[{"role":"user","content":"hi"}]}`), 511, 513},
	} {
		yields := 0
		if _, err := ParseRequestYielding(EndpointChat, tc.body, func() { yields++ }); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := ParseRequestYielding(EndpointChat, tc.body, nil); err != nil {
			t.Fatalf("%s, no yield: %v", tc.name, err)
		}
		if yields < tc.min || yields > tc.max {
			t.Errorf("%s: %d yields, want %d-%d", tc.name, yields, tc.min, tc.max)
		}
	}
}

// Skipping a string in slices, yielding between them, ends where skipping it whole does, with the same error,
// and yields at least once per slice and six bytes (the longest escape) of what it read.
func FuzzSkipStringInSlices(f *testing.F) {
	f.Add([]byte(`abc"`), uint8(1))
	f.Add([]byte(`a\"b\u00e9c"`), uint8(2))
	f.Add([]byte("a\x01b\""), uint8(3))
	f.Add([]byte(`abc\`), uint8(1))
	f.Add([]byte(`abcdefgh`), uint8(4))
	f.Add([]byte(`a\nb\nc\nd\ne\nf"`), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, every uint8) {
		wantEnd, wantErr := skipString(b, 0)
		yields := 0
		bud := budget{yield: func() { yields++ }, every: int(every%16) + 1}
		bud.next = bud.every
		end, err := skipStringIn(b, 0, &bud)
		if end != wantEnd || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("in slices of %d: %d, %v; whole: %d, %v", bud.every, end, err, wantEnd, wantErr)
		}
		read := end
		var se *scanError
		if errors.As(err, &se) {
			read = se.offset
		}
		if least := read/(bud.every+6) - 1; yields < least {
			t.Fatalf("%d yields over %d bytes in slices of %d, want at least %d", yields, read, bud.every, least)
		}
	})
}
