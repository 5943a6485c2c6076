package usage_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// Bodies built to make a scanner quadratic (keys that open objects that
// never close, endless nesting, runs of escapes, one endless line, endless
// events, keys in the tail of events too long to keep) cost time linear in
// their size: 1 MiB of each reads, through every mode, within a generous
// bound.
func TestHostileBodies(t *testing.T) {
	const size = 1 << 20
	rep := func(s string) []byte { return bytes.Repeat([]byte(s), size/len(s)) }
	bodies := map[string][]byte{
		"usage-open":        rep(`"usage":{`),
		"usage-open-data":   append([]byte("data: "), rep(`"usage":{`)...),
		"eval-count":        rep(`"eval_count":1`),
		"braces":            rep(`{`),
		"brackets":          append([]byte(`data: {"choices":`), rep(`[`)...),
		"escapes":           append([]byte(`data: {"choices":[{"delta":{"content":"`), rep(`\"\\`)...),
		"backslashes":       append([]byte(`{"usage":"`), rep(`\`)...),
		"no-newline":        rep(`data: {"usage":null} `),
		"empty-events":      rep("data:\n\n"),
		"data-lines":        rep("data: {\"usage\":null,\n"),
		"cr":                rep("\r"),
		"unicode":           append([]byte(`{"choices":[{"message":{"content":"`), rep(`\ud83d\u`)...),
		"members":           append([]byte("data: {"), rep(`"usage":null,`)...),
		"usage-chunks":      rep(`data: {"choices":[],"usage":{"prompt_tokens":1}}` + "\n\n"),
		"usage-open-events": bytes.Repeat(append(append([]byte("data: "), bytes.Repeat([]byte(`"usage":{`), 8000)...), "\n\n"...), 14),
	}
	for name, body := range bodies {
		for _, o := range []usage.Options{
			{API: usage.OpenAIChat, Stream: true, Strip: true},
			{API: usage.OpenAIChat, Stream: true},
			{API: usage.Generic, Stream: true, MaxEvent: 100, MaxText: 100},
			{API: usage.Generic, MaxBody: 100, MaxText: 100},
			{API: usage.Anthropic},
		} {
			t.Run(fmt.Sprintf("%s/%+v", name, o), func(t *testing.T) {
				start := time.Now()
				out, _ := run(t, bytes.NewReader(body), o)
				if !o.Strip && !bytes.Equal(out, body) {
					t.Fatal("output differs")
				}
				// Each takes milliseconds (tens under -race); the quadratic
				// scans these bodies were built against take seconds.
				if d := time.Since(start); d > time.Second {
					t.Fatalf("took %v", d)
				}
			})
		}
	}
}
