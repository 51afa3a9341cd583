package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/infergate/infergate/policies"
)

// stdinReader is where hash-key reads a key from when none is given; tests replace it.
var stdinReader io.Reader = os.Stdin

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `infergate — an LLM routing gateway for Envoy

Usage:
  infergate serve --policy FILE [flags]   run the ext_proc, xDS and metrics servers
  infergate validate FILE...              check policy files; print every problem with file:line
  infergate schema                        print the policy JSON Schema (for editors)
  infergate hash-key [KEY]                print the sha256 form of an API key for a policy (reads stdin without KEY)
  infergate digest --key-file KEY [FILE]  the audit log's digest of a prompt or output (FILE, or stdin) under a key
  infergate plan --policy FILE --workload FILE
                                          replicas, KV cache and cost per pool for a load (--live ADDR: a running fleet)
  infergate rollout status|pause|resume|abort|promote [MODEL]
                                          a running gateway's rollouts, through its admin endpoint
  infergate version                       print the version

Run 'infergate serve -h' for the serve flags.
`

// run is main without the process: tests call it with their own arguments and writers.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if help, ok := commandHelp[args[0]]; ok && len(args) > 1 && isHelpFlag(args[1]) {
		fmt.Fprintln(stdout, help) // never a file named --help, a key "--help" or a schema
		return 0
	}
	switch args[0] {
	case "serve":
		return cmdServe(ctx, args[1:], stdout, stderr)
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "schema":
		return cmdSchema(stdout, stderr)
	case "hash-key":
		return cmdHashKey(args[1:], stdout, stderr)
	case "digest":
		return cmdDigest(args[1:], stdout, stderr)
	case "rollout":
		return cmdRollout(args[1:], stdout, stderr)
	case "plan":
		return cmdPlan(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-v":
		bi, _ := debug.ReadBuildInfo()
		fmt.Fprintln(stdout, "infergate", versionOf(version, bi))
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "infergate: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// commandHelp is each small command's usage, for `infergate CMD --help` (serve has its flag set's).
var commandHelp = map[string]string{
	"validate": "usage: infergate validate FILE...\n\nChecks policy files and prints every problem with file:line; exit 1 when any has one.",
	"schema":   "usage: infergate schema\n\nPrints the policy JSON Schema, for editors.",
	"hash-key": "usage: infergate hash-key [KEY]\n\nPrints the sha256: form of an API key that a policy stores; reads the key from standard input without KEY.",
	"version":  "usage: infergate version",
}

// versionOf is the version a build was stamped with (-ldflags "-X main.version=…"), else what the Go
// toolchain recorded: the module version of `go install …@v1.2.3`, or the commit (with "+dirty" for local
// changes) of a build in a checkout.
// buildVersion is this binary's version, as `infergate version` prints it.
func buildVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, bi)
}

func versionOf(stamped string, bi *debug.BuildInfo) string {
	if stamped != "" && stamped != "dev" {
		return stamped
	}
	if bi == nil {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		rev += "+dirty"
	}
	return "dev-" + rev
}

func isHelpFlag(a string) bool { return a == "-h" || a == "--help" || a == "-help" || a == "help" }

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: infergate validate FILE...")
		return 2
	}
	code := 0
	for _, path := range args {
		snap, err := policies.LoadFile(path)
		var inv *policies.InvalidError
		switch {
		case errors.As(err, &inv):
			for _, p := range inv.Problems {
				fmt.Fprintln(stderr, p.String())
			}
			fmt.Fprintf(stderr, "%s: %d problem(s)\n", path, len(inv.Problems))
			code = 1
		case err != nil:
			fmt.Fprintf(stderr, "%s: %v\n", path, err)
			code = 1
		default:
			sp := snap.Policy.Spec
			fmt.Fprintf(stdout, "%s: ok (version %s: %d models, %d tenants, %d hardware classes)\n",
				path, snap.Version, len(sp.Models), len(sp.Tenants), len(sp.HardwareClasses))
		}
	}
	return code
}

func cmdSchema(stdout, stderr io.Writer) int {
	b, err := policies.JSONSchema()
	if err != nil {
		fmt.Fprintln(stderr, "infergate:", err)
		return 1
	}
	_, _ = stdout.Write(b)
	return 0
}

func cmdHashKey(args []string, stdout, stderr io.Writer) int {
	key := ""
	if len(args) > 0 {
		key = args[0]
	} else {
		line, err := bufio.NewReader(stdinReader).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(stderr, "infergate: read key:", err)
			return 1
		}
		key = strings.TrimSpace(line)
	}
	if key == "" {
		fmt.Fprintln(stderr, "usage: infergate hash-key KEY (or the key on standard input)")
		return 2
	}
	fmt.Fprintln(stdout, policies.HashKey(key))
	return 0
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: %w", level, err)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv})), nil
}

// newFlagSet returns a flag set that reports errors instead of exiting, so tests can call run.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
