package main

import (
	"fmt"
	"io"
	"os"

	"github.com/infergate/infergate/audit"
)

// maxDigestInput bounds what `infergate digest` reads: the largest body a policy may allow.
const maxDigestInput = 64 << 20

// cmdDigest prints the key id and the digest of a text as the audit log records it, so that an auditor who
// holds the key can check a prompt (the value of messages, prompt or input exactly as the client sent it) or
// an output against a record.
func cmdDigest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("digest", stderr)
	keyFile := fs.String("key-file", "", "the audit digest key file the gateway was given (--audit-key-file)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *keyFile == "" || fs.NArg() > 1 {
		fmt.Fprintln(stderr, "usage: infergate digest --key-file KEY [FILE]  (reads standard input without FILE)")
		return 2
	}
	key, err := audit.LoadDigestKey(*keyFile)
	if err != nil {
		fmt.Fprintln(stderr, "infergate digest:", err)
		return 1
	}
	in := io.Reader(stdinReader)
	if fs.NArg() == 1 {
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			fmt.Fprintln(stderr, "infergate digest:", err)
			return 1
		}
		defer f.Close()
		in = f
	}
	h := key.New()
	n, err := io.Copy(h, io.LimitReader(in, maxDigestInput+1))
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "infergate digest:", err)
		return 1
	case n > maxDigestInput:
		fmt.Fprintf(stderr, "infergate digest: input over %d bytes\n", maxDigestInput)
		return 1
	}
	fmt.Fprintf(stdout, "digest_key %s\nhmac %x\n", key.ID, h.Sum(nil))
	return 0
}
