package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/infergate/infergate/test/wait"
)

const quickstart = "../../examples/quickstart/policy.yaml"

func TestValidateCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"validate", quickstart}, &out, &errOut); code != 0 {
		t.Fatalf("validate quickstart: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "ok") {
		t.Errorf("stdout = %q", out.String())
	}
	out.Reset()
	bad := "../../policies/testdata/invalid/many-problems.yaml"
	if code := run(context.Background(), []string{"validate", bad}, &out, &errOut); code != 1 {
		t.Fatalf("validate broken policy: exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if len(lines) < 20 {
		t.Fatalf("want every problem listed, got %d lines:\n%s", len(lines), errOut.String())
	}
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasPrefix(l, bad+":") || strings.Count(l, ":") < 3 {
			t.Errorf("problem line without file:line: %q", l)
		}
	}
}

func TestSmallCommands(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"version"}, 0, "infergate"},
		{[]string{"hash-key", "sk-demo-acme"}, 0, "sha256:d4ffc8c0325f7e8e971bb4d7bc9f6a78c97920b5ac57b24380e53b6c7a96bc13"},
		{[]string{"schema"}, 0, `"$schema"`},
		{[]string{"bogus"}, 2, ""},
		{nil, 2, ""},
		{[]string{"serve"}, 2, ""},
		// --help is help, never a file, a key or a schema.
		{[]string{"validate", "--help"}, 0, "usage: infergate validate"},
		{[]string{"hash-key", "--help"}, 0, "usage: infergate hash-key"},
		{[]string{"schema", "-h"}, 0, "usage: infergate schema"},
	}
	for _, tc := range tests {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), tc.args, &out, &errOut); code != tc.code {
			t.Errorf("%v: exit %d, want %d (%s)", tc.args, code, tc.code, errOut.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: stdout %q lacks %q", tc.args, out.String(), tc.want)
		}
	}
	stdinReader = strings.NewReader("sk-demo-acme\n")
	var out bytes.Buffer
	if run(context.Background(), []string{"hash-key"}, &out, io.Discard) != 0 || !strings.Contains(out.String(), "sha256:d4ff") {
		t.Errorf("hash-key from stdin: %q", out.String())
	}
}

// logWatcher collects the JSON log lines serve writes and finds listen addresses in them.
type logWatcher struct {
	mu    sync.Mutex
	lines []map[string]any
	w     *io.PipeWriter
}

func newLogWatcher() *logWatcher {
	r, w := io.Pipe()
	lw := &logWatcher{w: w}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				lw.mu.Lock()
				lw.lines = append(lw.lines, m)
				lw.mu.Unlock()
			}
		}
	}()
	return lw
}

func (lw *logWatcher) waitFor(t *testing.T, msg string) map[string]any {
	t.Helper()
	var found map[string]any
	wait.For(t, "log line "+msg, func() bool {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		for _, l := range lw.lines {
			if l["msg"] == msg {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

func TestServeAnswersExtProcAndDrains(t *testing.T) {
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"serve", "--policy", quickstart, "--extproc-addr", "127.0.0.1:0",
			"--metrics-addr", "127.0.0.1:0", "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--drain-timeout", "10s", "--scrape-interval", "0"}, io.Discard, logs.w)
	}()
	extprocAddr := logs.waitFor(t, "ext_proc listening")["addr"].(string)
	metricsAddr := logs.waitFor(t, "metrics listening")["addr"].(string)
	// Three pools, the fallback, and the failover aggregates of the two pools of the model with a fallback.
	if pushed := logs.waitFor(t, "xds snapshot pushed"); pushed["clusters"].(float64) != 6 {
		t.Errorf("xds snapshot %v", pushed)
	}
	logs.waitFor(t, "xds listening")

	conn, err := grpc.NewClient(extprocAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hs, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil || hs.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness = %v, %v", hs, err)
	}

	// One request, held open across the shutdown signal: drain must let it finish.
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		{Key: "authorization", RawValue: []byte("Bearer sk-demo-acme")},
	}}
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED},
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}},
	})
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"qwen-7b","messages":[{"role":"user","content":"hi"}]}`), EndOfStream: true}}})
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var dest string
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	if !strings.HasPrefix(dest, "127.0.0.1:1812") {
		t.Fatalf("destination = %q, want a qwen replica", dest)
	}

	// Metrics are served in the Prometheus text format.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	routed := 0.0
	for _, m := range families["infergate_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" && l.GetValue() == "routed" {
				routed = m.GetCounter().GetValue()
			}
		}
	}
	if routed != 1 {
		t.Errorf("infergate_requests_total{outcome=routed} = %v, want 1", routed)
	}
	for _, name := range []string{"infergate_decision_duration_seconds", "infergate_policy_last_reload_success", "infergate_inflight_requests"} {
		if families[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}

	readyz := func() int {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusOK {
		t.Errorf("/readyz = %d before the drain", code)
	}
	cancel() // SIGTERM
	logs.waitFor(t, "draining")
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d while draining, want 503", code)
	}
	select {
	case code := <-exit:
		t.Fatalf("serve exited (%d) while a stream was open", code)
	case <-time.After(200 * time.Millisecond):
	}
	// The open request completes during the drain.
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}})
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("in-flight request cut during drain: %v", err)
	}
	_ = stream.CloseSend()
	_, _ = stream.Recv()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("serve exit %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop after the last stream closed")
	}
}

func TestServeRefusesInvalidPolicy(t *testing.T) {
	var errOut bytes.Buffer
	code := run(context.Background(), []string{"serve", "--policy", "../../policies/testdata/invalid/many-problems.yaml",
		"--extproc-addr", "127.0.0.1:0", "--metrics-addr", "", "--admin-addr", ""}, io.Discard, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "many-problems.yaml:5:") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut.String())
	}
}

// An auditor holding the key gets the audit log's digest of a text: the HMAC-SHA256 under the key, named by
// the key's id, for the bytes exactly as given.
func TestDigestCommand(t *testing.T) {
	dir := t.TempDir()
	keyFile, text := filepath.Join(dir, "key"), filepath.Join(dir, "prompt.json")
	secret := "an auditor's copy of the digest key, 32+ bytes"
	if err := os.WriteFile(keyFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prompt := `[{"role":"user","content":"yes"}]`
	if err := os.WriteFile(text, []byte(prompt), 0o600); err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(prompt))
	id := sha256.Sum256([]byte(secret))
	want := fmt.Sprintf("digest_key %x\nhmac %x\n", id[:8], mac.Sum(nil))
	var out bytes.Buffer
	if code := run(context.Background(), []string{"digest", "--key-file", keyFile, text}, &out, io.Discard); code != 0 || out.String() != want {
		t.Errorf("digest of a file: exit %d, %q, want %q", code, out.String(), want)
	}
	stdinReader = strings.NewReader(prompt)
	out.Reset()
	if code := run(context.Background(), []string{"digest", "--key-file", keyFile}, &out, io.Discard); code != 0 || out.String() != want {
		t.Errorf("digest of stdin: exit %d, %q", code, out.String())
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("guessable"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"digest", "--key-file", short, text}, io.Discard, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "at least 32 bytes") {
		t.Errorf("a short key: exit %d, %s", code, errOut.String())
	}
}
