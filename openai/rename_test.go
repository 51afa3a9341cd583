package openai

import (
	"strings"
	"testing"
)

func TestModelRenamerAcrossChunks(t *testing.T) {
	body := `{"id":"c","object":"chat.completion","created":1,"model":"meta-llama/Llama-3.3-70B-Instruct",` +
		`"choices":[{"message":{"content":"a \"model\":\"x\" here","model":"nested"}}],"usage":{}}`
	want := strings.Replace(body, `"model":"meta-llama/Llama-3.3-70B-Instruct"`, `"model":"llama-70b"`, 1)
	valueAt := strings.Index(body, `"meta-llama`)
	valueEnd := valueAt + len(`"meta-llama/Llama-3.3-70B-Instruct"`)
	for cut := 0; cut <= len(body); cut++ {
		r := &ModelRenamer{Name: []byte(`"llama-70b"`)}
		got := string(r.Process([]byte(body[:cut]))) + string(r.Process([]byte(body[cut:])))
		expect := want
		if cut > valueAt && cut < valueEnd {
			expect = body // the value itself is cut: left as it came
		}
		if got != expect {
			t.Fatalf("cut %d: %s", cut, got)
		}
	}
}

func TestModelRenamerLeavesOthersAlone(t *testing.T) {
	for _, body := range []string{
		`{"error":{"message":"x","model":"inner"}}`,
		`{"models":"x","model":null}`,
		`[{"model":"x"}]`,
		`not json "model":"x"`,
	} {
		r := &ModelRenamer{Name: []byte(`"y"`)}
		if got := string(r.Process([]byte(body))); got != body {
			t.Errorf("%s became %s", body, got)
		}
	}
}

func FuzzModelRenamer(f *testing.F) {
	f.Add(`{"model":"m","x":1}`, uint16(5))
	f.Add(`{"a":"\\\"model\"","model":"m"}`, uint16(9))
	f.Fuzz(func(t *testing.T, body string, cut uint16) {
		c := int(cut) % (len(body) + 1)
		r := &ModelRenamer{Name: []byte(`"renamed"`)}
		got := string(r.Process([]byte(body[:c]))) + string(r.Process([]byte(body[c:])))
		if strings.Count(got, `"renamed"`) > strings.Count(body, `"renamed"`)+1 {
			t.Fatalf("renamed more than once: %q", got)
		}
		if got != body && !strings.Contains(got, `"renamed"`) {
			t.Fatalf("changed without renaming: %q → %q", body, got)
		}
	})
}
