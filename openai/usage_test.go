package openai

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUsageFromJSON(t *testing.T) {
	u, ok := UsageFromJSON(readFixture(t, "vllm-chat-completion.json"))
	if !ok || u != (Usage{PromptTokens: 6, CompletionTokens: 1, CachedReported: true}) {
		t.Fatalf("usage = %+v, %v", u, ok)
	}
	// An engine without --enable-prompt-tokens-details reports no cached count: not the same as a miss.
	if u, ok := UsageFromJSON([]byte(`{"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)); !ok || u.CachedReported {
		t.Errorf("usage without details = %+v, %v", u, ok)
	}
	for _, body := range []string{`{}`, `{"usage":null}`, `not json`, `{"usage":{"foo":1}}`} {
		if _, ok := UsageFromJSON([]byte(body)); ok {
			t.Errorf("UsageFromJSON(%s) reported usage", body)
		}
	}
}

// runChunks feeds data to a scanner cut at the given offsets and returns what it forwards.
func runChunks(s *SSEScanner, data []byte, cuts ...int) []byte {
	var out []byte
	prev := 0
	for _, c := range append(cuts, len(data)) {
		chunk := append([]byte(nil), data[prev:c]...) // a fresh buffer, as gRPC gives each message
		out = append(out, s.Process(chunk, c == len(data))...)
		prev = c
	}
	return out
}

func TestSSEScannerEverySplit(t *testing.T) {
	stream := readFixture(t, "vllm-chat-stream.sse")
	crlf := bytes.ReplaceAll(stream, []byte("\n"), []byte("\r\n"))
	want := Usage{PromptTokens: 26, CompletionTokens: 1, CachedTokens: 16, CachedReported: true}
	for name, data := range map[string][]byte{"lf": stream, "crlf": crlf} {
		withoutUsage := dropUsageEvent(t, data)
		for cut := 0; cut <= len(data); cut++ {
			for _, drop := range []bool{false, true} {
				s := &SSEScanner{DropUsageChunk: drop}
				out := runChunks(s, data, cut)
				u, ok := s.Usage()
				if !ok || u != want {
					t.Fatalf("%s cut=%d drop=%v: usage = %+v, %v", name, cut, drop, u, ok)
				}
				wantOut := data
				if drop {
					wantOut = withoutUsage
				}
				if !bytes.Equal(out, wantOut) {
					t.Fatalf("%s cut=%d drop=%v: forwarded\n%q\nwant\n%q", name, cut, drop, out, wantOut)
				}
			}
		}
	}
}

// dropUsageEvent removes the usage-only event from a stream by hand, as the expected output.
func dropUsageEvent(t *testing.T, data []byte) []byte {
	sep := "\n\n"
	if bytes.Contains(data, []byte("\r\n")) {
		sep = "\r\n\r\n"
	}
	events := strings.Split(string(data), sep)
	var kept []string
	for _, ev := range events {
		if strings.Contains(ev, `"choices":[]`) {
			continue
		}
		kept = append(kept, ev)
	}
	out := strings.Join(kept, sep)
	if len(out) == len(data) {
		t.Fatal("fixture has no usage-only event")
	}
	return []byte(out)
}

func TestSSEScannerThreeWaySplits(t *testing.T) {
	data := readFixture(t, "vllm-chat-stream.sse")
	want := dropUsageEvent(t, data)
	for a := 0; a < len(data); a += 7 {
		for b := a; b < len(data); b += 11 {
			s := &SSEScanner{DropUsageChunk: true}
			if out := runChunks(s, data, a, b); !bytes.Equal(out, want) {
				t.Fatalf("cuts %d,%d: got %q", a, b, out)
			}
		}
	}
}

func TestSSEScannerKeepsUsageChunkWithChoices(t *testing.T) {
	// Engines that attach usage to every chunk (continuous usage) must not lose content.
	data := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	s := &SSEScanner{DropUsageChunk: true}
	if out := s.Process(data, true); !bytes.Equal(out, data) {
		t.Fatalf("content chunk dropped: %q", out)
	}
	if u, _ := s.Usage(); u.CompletionTokens != 2 {
		t.Fatalf("usage = %+v, want the last report", u)
	}
}

func FuzzSSEScanner(f *testing.F) {
	f.Add(readFixture(f, "vllm-chat-stream.sse"), uint16(10), uint16(100))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":1},\"choices\":[]}\r\n\r\n: keep-alive\n\n"), uint16(3), uint16(4))
	f.Fuzz(func(t *testing.T, data []byte, a, b uint16) {
		cutA, cutB := int(a)%(len(data)+1), int(b)%(len(data)+1)
		if cutA > cutB {
			cutA, cutB = cutB, cutA
		}
		for i, drop := range []bool{false, true, false, true} {
			var rename []byte
			if i >= 2 {
				rename = []byte(`"renamed"`)
			}
			var wholeText, splitText bytes.Buffer
			whole := &SSEScanner{DropUsageChunk: drop, RenameModel: rename, Text: &wholeText}
			wantOut := whole.Process(append([]byte(nil), data...), true)
			split := &SSEScanner{DropUsageChunk: drop, RenameModel: rename, Text: &splitText}
			got := runChunks(split, data, cutA, cutB)
			if !bytes.Equal(got, wantOut) {
				t.Fatalf("drop=%v: split output differs from whole output", drop)
			}
			if !bytes.Equal(wholeText.Bytes(), splitText.Bytes()) {
				t.Fatalf("drop=%v: the generated text depends on chunk boundaries", drop)
			}
			u1, ok1 := whole.Usage()
			u2, ok2 := split.Usage()
			if u1 != u2 || ok1 != ok2 {
				t.Fatalf("drop=%v: usage differs: %+v/%v vs %+v/%v", drop, u1, ok1, u2, ok2)
			}
			if whole.FinishReason() != split.FinishReason() || !knownFinish(whole.FinishReason()) {
				t.Fatalf("drop=%v: finish reason %q whole, %q split", drop, whole.FinishReason(), split.FinishReason())
			}
			if !drop && rename == nil && !bytes.Equal(got, data) {
				t.Fatal("scan mode changed the stream")
			}
		}
	})
}

func TestSSEFinalEventWithoutBlankLine(t *testing.T) {
	data := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n")
	for _, drop := range []bool{false, true} {
		s := &SSEScanner{DropUsageChunk: drop}
		out := runChunks(s, data, 10)
		if u, ok := s.Usage(); !ok || u.PromptTokens != 3 {
			t.Errorf("drop=%v: usage of an unterminated last event lost: %+v", drop, u)
		}
		if drop && bytes.Contains(out, []byte(`"choices":[]`)) {
			t.Errorf("usage chunk forwarded: %q", out)
		}
		if s.ContentEvents() != 1 {
			t.Errorf("content events %d", s.ContentEvents())
		}
	}
}

// An upstream that never separates events with blank lines: every byte reaches the client as it arrives
// (nothing held back but a partial line), and usage is still read.
func TestSSEWithoutBlankLinesPassesThrough(t *testing.T) {
	data := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n" +
		"data: [DONE]\n")
	for _, drop := range []bool{false, true} {
		s := &SSEScanner{DropUsageChunk: drop}
		var out []byte
		fed := 0 // bytes of the lines before this one
		lines := bytes.SplitAfter(data, []byte("\n"))
		for i, l := range lines {
			got := s.Process(append([]byte(nil), l...), i == len(lines)-1)
			if !drop && !bytes.Equal(got, l) {
				t.Fatalf("scan mode changed line %d", i)
			}
			out = append(out, got...)
			// At most the line just fed is held back.
			if !bytes.HasPrefix(data, out) || len(out) < fed {
				t.Fatalf("drop=%v: after line %d forwarded %q", drop, i, out)
			}
			fed += len(l)
		}
		if !bytes.Equal(out, data) {
			t.Errorf("drop=%v: forwarded %q, want the stream unchanged", drop, out)
		}
		if u, ok := s.Usage(); !ok || u.CompletionTokens != 2 {
			t.Errorf("drop=%v: usage %+v %v", drop, u, ok)
		}
		if s.ContentEvents() != 2 {
			t.Errorf("drop=%v: content events %d", drop, s.ContentEvents())
		}
	}
}

// A line longer than the scanner holds passes through unparsed, whole.
func TestSSELongLinePassesThrough(t *testing.T) {
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", maxPendingLine+10) + "\"}}]}\n\n"
	data := []byte(long + "data: [DONE]\n\n")
	s := &SSEScanner{DropUsageChunk: true}
	if out := runChunks(s, data, 100, maxPendingLine+5, maxPendingLine+20); !bytes.Equal(out, data) {
		t.Errorf("long line changed: %d bytes out of %d", len(out), len(data))
	}
}

func FuzzUsageFromJSON(f *testing.F) {
	f.Add(readFixture(f, "vllm-chat-completion.json"))
	f.Add([]byte(`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":-1,"prompt_tokens_details":{"cached_tokens":1e99}}}`))
	f.Add([]byte(`{"usage":` + strings.Repeat("[", 1000)))
	f.Fuzz(func(t *testing.T, body []byte) {
		OutputText(body, io.Discard) // must not panic on any body
		if r := FinishReason(body); !knownFinish(r) {
			t.Fatalf("finish reason %q is not one of the constants", r)
		}
		u, ok := UsageFromJSON(body)
		if !ok && u != (Usage{}) {
			t.Fatalf("usage %+v reported without ok", u)
		}
		if u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens < 0 {
			t.Fatalf("negative usage %+v from %q", u, body)
		}
		if u.Total() < 0 {
			t.Fatalf("total wrapped: %+v", u)
		}
	})
}

func TestSSEScannerComplete(t *testing.T) {
	for _, tc := range []struct {
		stream string
		want   bool
	}{
		{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n", false},
		{"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", true},
		{"data:[DONE]\n\n", true},
		{"data: [DONE]x\n\n", false},
		{"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n", true},
		{"data: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n", false},
	} {
		var s SSEScanner
		s.Process([]byte(tc.stream), false)
		if s.Complete() != tc.want {
			t.Errorf("%q: complete %v, want %v", tc.stream, s.Complete(), tc.want)
		}
	}
}

// knownFinish says whether a recorded finish reason is one of the few the gateway records.
func knownFinish(r string) bool {
	switch r {
	case "", FinishStop, FinishLength, FinishToolCalls, FinishContentFilter, FinishOther:
		return true
	}
	return false
}
