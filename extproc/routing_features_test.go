package extproc

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/infergate/infergate/contract"
	"github.com/infergate/infergate/policies"
)

// featuresHarness serves testdata/policy.yaml with a LoRA adapter on llama, tiers (initech is "free": L40S
// only, so llama on H200 is out of its reach) and the debug scores header on.
func featuresHarness(t *testing.T) *harness {
	t.Helper()
	src, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	for old, new := range map[string]string{
		"    aliases: [llama-70b]\n": "    aliases: [llama-70b]\n    adapters: [llama-sql]\n",
		"  tenants:\n":               "  routing: {debugScores: true}\n  tiers:\n    pro: {}\n    free: {hardwareClasses: [l40s]}\n  tenants:\n",
		"  - name: acme                       # key: sk-demo-acme\n":    "  - name: acme                       # key: sk-demo-acme\n    tier: pro\n",
		"  - name: initech                    # key: sk-demo-initech\n": "  - name: initech                    # key: sk-demo-initech\n    tier: free\n",
	} {
		if !strings.Contains(text, old) {
			t.Fatalf("testdata/policy.yaml changed: %q not found", old)
		}
		text = strings.Replace(text, old, new, 1)
	}
	text = strings.Replace(text, "models: [qwen2.5-7b]", `models: ["*"]`, 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return newHarnessWith(t, snap, config{})
}

// post sends one BUFFERED chat request with a key and returns the stream and the answer to the body.
func post(t *testing.T, h *harness, key, body string, respMode bodyMode) (*stream, *extprocv3.ProcessingResponse) {
	t.Helper()
	s := h.open(t, modeBuffered, respMode)
	s.send(postHeaders("/v1/chat/completions", key))
	s.recv()
	s.send(reqBody([]byte(body), true))
	return s, s.recv()
}

func TestAdapterRequestKeepsItsName(t *testing.T) {
	h := featuresHarness(t)
	_, r := post(t, h, keyAcme, `{"model":"llama-sql","messages":[{"role":"user","content":"list users"}]}`, modeNone)
	br := r.GetRequestBody().GetResponse()
	if br == nil {
		t.Fatalf("not routed: %v", r)
	}
	set := setHeaders(br.GetHeaderMutation())
	checkRouting(t, set, r, "llama-3.3-70b", "llama70b-h200")
	// The engine serves the adapter under its own name: the body is not rewritten to the base model.
	if body := br.GetBodyMutation().GetBody(); body != nil {
		var doc map[string]any
		if err := json.Unmarshal(body, &doc); err != nil || doc["model"] != "llama-sql" {
			t.Errorf("adapter name rewritten: %s", body)
		}
	}
}

func TestTierLimitsHardware(t *testing.T) {
	h := featuresHarness(t)
	// initech's tier may use only L40S: llama (H200 only) is forbidden and not listed; qwen (L40S) is fine.
	_, r := post(t, h, keyInitech, chatBody, modeNone)
	if status, code := immediateError(t, r); status != 403 || code != "model_not_allowed" {
		t.Errorf("llama for the free tier: %d %q", status, code)
	}
	if _, r := post(t, h, keyInitech, `{"model":"qwen2.5-7b","messages":[{"role":"user","content":"hi"}]}`, modeNone); r.GetRequestBody() == nil {
		t.Errorf("qwen for the free tier not routed: %v", r)
	}
}

func TestDebugScoresHeader(t *testing.T) {
	h := featuresHarness(t)
	s, r := post(t, h, keyAcme, chatBody, modeBuffered)
	dest := setHeaders(r.GetRequestBody().GetResponse().GetHeaderMutation())[contract.HeaderDestination]
	s.send(respHeaders("200", false, "content-type", "application/json"))
	hdr := setHeaders(s.recv().GetResponseHeaders().GetResponse().GetHeaderMutation())[contract.HeaderScores]
	first, _, _ := strings.Cut(dest, ",")
	if !strings.HasPrefix(hdr, first+";total=") || strings.Count(hdr, ";prefill=") != 3 {
		t.Errorf("%s = %q, want the three llama endpoints' scores, %s first", contract.HeaderScores, hdr, first)
	}
}

// BUFFERED_PARTIAL: a body Envoy cut at its buffer limit cannot be routed (413); a whole body — its declared
// content-length — without end_of_stream is trailers to come, and is routed.
func TestBufferedPartial(t *testing.T) {
	h := newHarness(t)
	partial := filterv3.ProcessingMode_BUFFERED_PARTIAL
	s := h.open(t, partial, modeNone)
	s.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(chatBody))))
	s.recv()
	s.send(reqBody([]byte(chatBody), false))
	if r := s.recv(); r.GetRequestBody() == nil {
		t.Fatalf("whole body before trailers not routed: %v", r)
	}
	s2 := h.open(t, partial, modeNone)
	s2.send(postHeaders("/v1/chat/completions", keyAcme, "content-length", strconv.Itoa(len(chatBody)+4096)))
	s2.recv()
	s2.send(reqBody([]byte(chatBody), false))
	if status, _ := immediateError(t, s2.recv()); status != 413 {
		t.Errorf("cut body: %d, want 413", status)
	}
}

// An adapter is granted like a model: a tenant that may call the base model may not call its adapters unless
// it lists them, and its model list shows only what it may call.
func TestAdapterNeedsItsOwnGrant(t *testing.T) {
	src, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    aliases: [llama-70b]\n", "    aliases: [llama-70b]\n    adapters: [llama-sql, llama-legal]\n", 1)
	text = strings.Replace(text, "models: [qwen2.5-7b]", "models: [llama-3.3-70b, llama-legal]", 1)
	snap, err := policies.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, snap, config{})
	_, r := post(t, h, keyInitech, `{"model":"llama-sql","messages":[{"role":"user","content":"x"}]}`, modeNone)
	if status, code := immediateError(t, r); status != 403 || code != "model_not_allowed" {
		t.Errorf("an adapter the tenant does not list: %d %q", status, code)
	}
	for _, model := range []string{"llama-legal", "llama-70b"} {
		if _, r := post(t, h, keyInitech, `{"model":"`+model+`","messages":[{"role":"user","content":"x"}]}`, modeNone); r.GetRequestBody() == nil {
			t.Errorf("%s not routed: %v", model, r)
		}
	}
	s := h.open(t, modeBuffered, modeNone)
	s.send(reqHeaders(true, ":method", "GET", ":path", "/v1/models", "authorization", "Bearer "+keyInitech))
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(s.recv().GetImmediateResponse().GetBody(), &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "llama-3.3-70b,llama-70b,llama-legal" {
		t.Errorf("initech's models: %v", ids)
	}
}
