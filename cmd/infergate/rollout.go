package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/infergate/infergate/rollout"
)

const rolloutUsage = `usage: infergate rollout status [MODEL] [flags]
       infergate rollout pause|resume|abort|promote MODEL [flags]

Talks to the admin endpoint of a running infergate serve (--admin-addr). status shows every rollout: its
phase, step, candidate share and this replica's last gate figures. pause holds the step; resume continues a
paused rollout, or starts a rolled-back or aborted one over at its compatibility gate; abort returns all
traffic to the baseline at once; promote gives the candidate all traffic.

Flags:`

type rolloutFlags struct {
	admin, caFile, certFile, keyFile string
	json                             bool
}

func cmdRollout(args []string, stdout, stderr io.Writer) int {
	var f rolloutFlags
	fs := newFlagSet("rollout", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, rolloutUsage); fs.PrintDefaults() }
	fs.StringVar(&f.admin, "admin", "http://127.0.0.1:9091", "the admin endpoint's URL (https:// when serve has --tls-cert)")
	fs.StringVar(&f.caFile, "tls-ca", "", "PEM CA bundle that signed the admin endpoint's certificate")
	fs.StringVar(&f.certFile, "tls-cert", "", "PEM client certificate, for an admin endpoint behind mutual TLS")
	fs.StringVar(&f.keyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.BoolVar(&f.json, "json", false, "print the endpoint's JSON")
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	if len(pos) == 0 || len(pos) > 2 {
		fs.Usage()
		return 2
	}
	cmd, model := pos[0], ""
	if len(pos) == 2 {
		model = pos[1]
	}
	client, err := f.client()
	if err != nil {
		fmt.Fprintln(stderr, "infergate rollout:", err)
		return 2
	}
	switch rollout.Command(cmd) {
	case rollout.Pause, rollout.Resume, rollout.Abort, rollout.Promote:
		if model == "" {
			fmt.Fprintf(stderr, "infergate rollout %s: name the model\n", cmd)
			return 2
		}
		return f.call(client, http.MethodPost, rollout.AdminPath+"/"+cmd, model, stdout, stderr)
	}
	if cmd != "status" {
		fmt.Fprintf(stderr, "infergate rollout: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	return f.call(client, http.MethodGet, rollout.AdminPath, model, stdout, stderr)
}

// parseInterleaved parses flags that may come before or after the positional arguments.
func parseInterleaved(fs interface {
	Parse([]string) error
	Args() []string
}, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

func (f rolloutFlags) client() (*http.Client, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	if f.caFile == "" && f.certFile == "" {
		return c, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", f.caFile)
		}
	}
	if f.certFile != "" {
		pair, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	c.Transport = &http.Transport{TLSClientConfig: tc}
	return c, nil
}

// call sends one request to the admin endpoint and prints its answer.
func (f rolloutFlags) call(c *http.Client, method, path, model string, stdout, stderr io.Writer) int {
	u := strings.TrimSuffix(f.admin, "/") + path
	if model != "" {
		u += "?model=" + url.QueryEscape(model)
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		fmt.Fprintln(stderr, "infergate rollout:", err)
		return 2
	}
	req.Header.Set(rollout.AdminHeader, "cli")
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "infergate rollout: the admin endpoint did not answer:", err)
		return 1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		fmt.Fprintln(stderr, "infergate rollout:", err)
		return 1
	}
	if resp.StatusCode != http.StatusOK {
		var e rollout.AdminError
		if json.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		fmt.Fprintf(stderr, "infergate rollout: %s (%d)\n", e.Error, resp.StatusCode)
		return 1
	}
	if f.json {
		_, _ = stdout.Write(body)
		return 0
	}
	var list []rollout.Status
	if method == http.MethodPost {
		var one rollout.Status
		err = json.Unmarshal(body, &one)
		list = []rollout.Status{one}
	} else {
		err = json.Unmarshal(body, &list)
	}
	if err != nil {
		fmt.Fprintln(stderr, "infergate rollout: unreadable answer:", err)
		return 1
	}
	printStatuses(stdout, list)
	return 0
}

func printStatuses(w io.Writer, list []rollout.Status) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no rollouts in the policy")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPHASE\tSTEP\tSHARE\tCANDIDATE\tSTEP REQUESTS\tSHARED\tREASON")
	for _, s := range list {
		step := "-"
		if s.Phase == rollout.Progressing || s.Phase == rollout.Paused {
			step = fmt.Sprintf("%d/%d", s.Step+1, s.Steps)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f%%\t%s\t%d\t%v\t%s\n", s.Model, s.Phase, step, 100*s.Share, s.Candidate,
			s.StepRequests, s.Shared, s.Reason)
	}
	_ = tw.Flush()
	for _, s := range list {
		if g := s.Gates; g != nil {
			fmt.Fprintf(w, "%s gates (this replica, the step so far): %s; candidate %d, baseline %d requests; goodput ×%.2f, error rate %+.3f, TTFT ×%.2f (p95 ×%.2f), TPOT ×%.2f (p95 ×%.2f)",
				s.Model, g.Result, g.CandidateRequests, g.BaselineRequests, g.GoodputRatio, g.ErrorRateIncrease, g.TTFTRatio, g.TTFTP95Ratio, g.TPOTRatio, g.TPOTP95Ratio)
			if g.Reason != "" {
				fmt.Fprintf(w, " (%s)", g.Reason)
			}
			fmt.Fprintln(w)
		}
		if e := s.Eval; e != nil {
			fmt.Fprintf(w, "%s eval gate (its last run on this replica): %s\n", s.Model, e)
		}
	}
}
