package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/ratelimit-proxy/ratelimit-proxy/proxy"
)

// maxKeyInput bounds what `ratelimit-proxy key` reads: a key, not a file.
const maxKeyInput = 64 << 10

// runKey is `ratelimit-proxy key`: read an API key on stdin and print its
// public forms (as logs and the admin API write the caller, and the
// api_key key part) and its SHA-256 (what API_KEYS_FILE lists), so that nobody computes either by
// hand and the key itself is never written anywhere.
func runKey(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-proxy key", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, `print {"caller","public","api_key","sha256"} instead of three lines`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimit-proxy key [-json] < key")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, "ratelimit-proxy key: the key is read on standard input, never from the command line (it would stay in the shell's history)")
		return 2
	}
	in, err := io.ReadAll(io.LimitReader(stdin, maxKeyInput+1))
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-proxy key: reading stdin: %v\n", err)
		return 1
	}
	if len(in) > maxKeyInput {
		fmt.Fprintf(stderr, "ratelimit-proxy key: more than %d bytes on stdin: give one key\n", maxKeyInput)
		return 1
	}
	f, ok := proxy.KeyFormsOf(string(in))
	if !ok {
		fmt.Fprintln(stderr, "ratelimit-proxy key: no key on stdin")
		return 1
	}
	if *asJSON {
		out, _ := json.Marshal(struct {
			Caller string `json:"caller"`
			Public string `json:"public"`
			APIKey string `json:"api_key"`
			SHA256 string `json:"sha256"`
		}{f.Caller, "caller=" + f.Caller, "api_key=" + f.APIKey, f.SHA256})
		fmt.Fprintln(stdout, string(out))
		return 0
	}
	fmt.Fprintf(stdout, "caller=%s\napi_key=%s\nsha256 = %q\n", f.Caller, f.APIKey, f.SHA256)
	return 0
}
