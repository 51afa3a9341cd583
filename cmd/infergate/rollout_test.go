package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infergate/infergate/rollout"
	"github.com/infergate/infergate/test/tlstest"
	"github.com/infergate/infergate/test/wait"
)

// rolloutServe runs serve on examples/rollout/policy.yaml with its engines replaced by one stand-in that
// lists the model, and returns the admin endpoint's URL.
func rolloutServe(t *testing.T) string {
	t.Helper()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"acme/chat-8b","object":"model"}]}`)
	}))
	t.Cleanup(engine.Close)
	src, err := os.ReadFile("../../examples/rollout/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(engine.URL, "http://")
	policy := strings.NewReplacer(`"127.0.0.1:18201", "127.0.0.1:18202"`, `"127.0.0.1:1"`,
		`"127.0.0.1:18211", "127.0.0.1:18212"`, fmt.Sprintf("%q", addr),
		"engineVersion: 0.11.0", "model: acme/chat-8b").Replace(string(src))
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"serve", "--policy", path, "--extproc-addr", "127.0.0.1:0", "--metrics-addr", "",
			"--xds-addr", "", "--admin-addr", "127.0.0.1:0", "--scrape-interval", "0"}, io.Discard, logs.w)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-exit; code != 0 {
			t.Errorf("serve exited %d", code)
		}
	})
	return "http://" + logs.waitFor(t, "admin listening")["addr"].(string)
}

func rolloutCLI(t *testing.T, admin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append(append([]string{"rollout"}, args...), "--admin", admin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestRolloutCommands(t *testing.T) {
	admin := rolloutServe(t)
	var out string
	wait.For(t, "the rollout's first step", func() bool {
		_, out, _ = rolloutCLI(t, admin, "status")
		return strings.Contains(out, "progressing")
	})
	if !strings.Contains(out, "chat-8b") || !strings.Contains(out, "1/4") || !strings.Contains(out, "10.0%") {
		t.Fatalf("status:\n%s", out)
	}
	// A command without the admin header (what a web page could send) is refused.
	if resp, err := http.Post(admin+rollout.AdminPath+"/abort?model=chat-8b", "", nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a bare POST: %v %v", resp, err)
	}
	for _, tc := range []struct {
		args  []string
		code  int
		phase rollout.Phase
		share float64
		err   string
	}{
		{[]string{"pause", "chat-8b"}, 0, rollout.Paused, 0.1, ""},
		{[]string{"pause", "chat-8b"}, 1, "", 0, "does not apply"},
		{[]string{"resume", "chat-8b"}, 0, rollout.Progressing, 0.1, ""},
		{[]string{"abort", "chat-8b"}, 0, rollout.Aborted, 0, ""},
		{[]string{"promote", "chat-8b"}, 0, rollout.Promoted, 1, ""},
		{[]string{"abort", "nope"}, 1, "", 0, "no rollout"},
		{[]string{"abort"}, 2, "", 0, "name the model"},
		{[]string{"restart", "chat-8b"}, 2, "", 0, "unknown command"},
	} {
		code, out, errOut := rolloutCLI(t, admin, append(tc.args, "--json")...)
		if code != tc.code || !strings.Contains(errOut, tc.err) {
			t.Errorf("%v: exit %d, stderr %q; want %d with %q", tc.args, code, errOut, tc.code, tc.err)
			continue
		}
		if code != 0 {
			continue
		}
		var s rollout.Status
		if err := json.Unmarshal([]byte(out), &s); err != nil || s.Phase != tc.phase || s.Share != tc.share {
			t.Errorf("%v: %+v %v, want %s at %v", tc.args, s, err, tc.phase, tc.share)
		}
	}
	if code, _, errOut := rolloutCLI(t, "http://127.0.0.1:1", "status"); code != 1 || !strings.Contains(errOut, "did not answer") {
		t.Errorf("no gateway: exit %d, %q", code, errOut)
	}
}

// Whoever reaches the admin endpoint steers rollouts: beyond loopback serve wants mutual TLS.
func TestAdminBeyondLoopbackNeedsMutualTLS(t *testing.T) {
	var errOut bytes.Buffer
	code := run(context.Background(), []string{"serve", "--policy", "../../examples/rollout/policy.yaml", "--extproc-addr", "127.0.0.1:0",
		"--metrics-addr", "", "--xds-addr", "", "--admin-addr", "0.0.0.0:0", "--scrape-interval", "0"}, io.Discard, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "beyond loopback") {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

// A page whose host name rebinds to 127.0.0.1 reaches the loopback port, but not with a loopback Host.
func TestAdminAnswersOnlyLoopbackHosts(t *testing.T) {
	admin := rolloutServe(t)
	req, _ := http.NewRequest(http.MethodGet, admin+rollout.AdminPath, nil)
	req.Host = "attacker.example:9091"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("Host attacker.example: %d", resp.StatusCode)
	}
}

// With --tls-cert the admin endpoint is HTTPS and, with a client CA, answers only clients with a certificate.
func TestAdminOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := tlstest.NewCA(t, "server-ca"), tlstest.NewCA(t, "client-ca")
	certFile, keyFile := serverCA.Server(t).Write(t, dir)
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"serve", "--policy", "../../examples/rollout/policy.yaml", "--extproc-addr", "127.0.0.1:0",
			"--metrics-addr", "", "--xds-addr", "", "--admin-addr", "127.0.0.1:0", "--scrape-interval", "0",
			"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", clientCA.WriteCA(t, dir), "--admin-client-names", "operator"}, io.Discard, logs.w)
	}()
	t.Cleanup(func() { cancel(); <-exit })
	admin := "https://" + logs.waitFor(t, "admin listening")["addr"].(string)
	clientDir, serverDir := filepath.Join(dir, "client"), filepath.Join(dir, "server")
	for _, d := range []string{clientDir, serverDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	clientCert, clientKey := clientCA.Client(t, "operator").Write(t, clientDir)
	caFile := serverCA.WriteCA(t, serverDir)
	if code, out, errOut := rolloutCLI(t, admin, "status", "--tls-ca", caFile, "--tls-cert", clientCert, "--tls-key", clientKey); code != 0 {
		t.Fatalf("with a client certificate: %d %s %s", code, out, errOut)
	}
	if code, _, _ := rolloutCLI(t, admin, "status", "--tls-ca", caFile); code != 1 {
		t.Fatalf("without a client certificate: exit %d", code)
	}
	// A certificate from the same CA with another name (an Envoy's) is refused.
	envoyCert, envoyKey := clientCA.Client(t, "envoy-1").Write(t, serverDir)
	if code, _, errOut := rolloutCLI(t, admin, "status", "--tls-ca", caFile, "--tls-cert", envoyCert, "--tls-key", envoyKey); code != 1 ||
		!strings.Contains(errOut, "names no admin client") {
		t.Fatalf("another client's certificate: exit %d %s", code, errOut)
	}
}

// The status shows the eval gate's last run with its cases and rates.
func TestPrintStatusesShowsTheEvalGate(t *testing.T) {
	var b strings.Builder
	printStatuses(&b, []rollout.Status{{Model: "chat-8b", Candidate: "chat-v2", State: rollout.State{Phase: rollout.RolledBack, Reason: "eval gate"},
		Eval: &rollout.EvalReport{Cases: 3, Candidate: 2.0 / 3, Baseline: 1, Margin: 0.05, Regressed: []string{"capital"}}}})
	want := "chat-8b eval gate (its last run on this replica): candidate passed 66.7% of 3 cases, the baseline 100.0% (margin 5.0 points); worse on capital\n"
	if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "rolled_back") {
		t.Fatalf("status:\n%s\nwant the line %q", b.String(), want)
	}
}
