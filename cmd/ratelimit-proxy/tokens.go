package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/ratelimit-proxy/ratelimit-proxy/tokens"
)

// runTokens is `ratelimit-proxy tokens`: print the input-token estimate of
// a request body read from stdin, as the token cap counts it — the number
// alone, or with -json the model and encoding it was counted with.
func runTokens(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ratelimit-proxy tokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", "", "count as this `model` (default: the body's model field)")
	path := fs.String("path", "/v1/chat/completions", "the API `path` the body is for; it selects the format and overhead")
	contentType := fs.String("content-type", "application/json", "the body's Content-Type (multipart needs its boundary)")
	asJSON := fs.Bool("json", false, `print {"estimated_tokens","model","encoding","path"} instead of the number alone`)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ratelimit-proxy tokens [-model M] [-path P] [-content-type T] [-json] < body")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	body, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-proxy tokens: reading stdin: %v\n", err)
		return 1
	}
	est, err := tokens.New().Estimate(tokens.Request{
		Format: tokens.FormatForPath(*path), ContentType: *contentType,
		Body: body, Model: *model,
	}, -1)
	if err != nil {
		if errors.Is(err, tokens.ErrInvalid) {
			fmt.Fprintf(stderr, "ratelimit-proxy tokens: %s\n", oneLine(err))
			return 1
		}
		fmt.Fprintf(stderr, "ratelimit-proxy tokens: %v\n", err)
		return 1
	}
	if !*asJSON {
		fmt.Fprintln(stdout, est.Tokens)
		return 0
	}
	out, _ := json.Marshal(map[string]any{"estimated_tokens": est.Tokens, "model": est.Model, "encoding": est.Encoding, "path": *path})
	fmt.Fprintln(stdout, string(out))
	return 0
}
