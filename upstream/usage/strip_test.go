package usage_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

var stripChat = usage.Options{API: usage.OpenAIChat, Stream: true, Strip: true, Count: countBytes}

// The stream the proxy asked usage for, stripped, is byte for byte the
// stream the client asked for, however the upstream cut its writes; the
// usage is the final chunk's.
func TestStripByteIdentical(t *testing.T) {
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		for _, nulls := range []bool{true, false} {
			for _, spaced := range []bool{false, true} {
				for _, noSpace := range []bool{false, true} {
					if spaced && !nulls {
						continue
					}
					f := chatForm{usage: true, nulls: nulls, spaced: spaced, eol: eol, noSpace: noSpace}
					t.Run(fmt.Sprintf("eol=%q/nulls=%v/spaced=%v/nospace=%v", eol, nulls, spaced, noSpace), func(t *testing.T) {
						with := chatStream(f)
						f.usage = false
						want := chatStream(f)
						if bytes.Equal(with, want) || !bytes.Contains(with, []byte(`"usage"`)) {
							t.Fatal("fixture: the two streams must differ by the usage")
						}
						got, res := check(t, with, stripChat)
						if !bytes.Equal(got, want) {
							t.Fatalf("stripped stream:\n%s\nwant\n%s", got, want)
						}
						if !res.Reported || res.Usage != chatUsage || !res.Complete {
							t.Fatalf("result %+v, want the final chunk's usage %+v", res, chatUsage)
						}
						if res.Output != 0 {
							t.Fatalf("Output %d: counted although the usage was reported", res.Output)
						}
						// Every single cut of the upstream's writes.
						for i := 0; i <= len(with); i++ {
							got, r := run(t, splitAt(with, i), stripChat)
							if !bytes.Equal(got, want) || r != res {
								t.Fatalf("split at %d: got\n%q\nresult %+v", i, got, r)
							}
						}
					})
				}
			}
		}
	}
}

// Without Strip (the client asked for usage itself) the stream passes
// unchanged and the usage is found.
func TestNoStripPassesUsage(t *testing.T) {
	for _, nulls := range []bool{true, false} {
		body := chatStream(chatForm{usage: true, nulls: nulls})
		o := stripChat
		o.Strip = false
		got, res := check(t, body, o)
		if !bytes.Equal(got, body) {
			t.Fatalf("nulls=%v: stream changed", nulls)
		}
		if !res.Reported || res.Usage != chatUsage {
			t.Fatalf("nulls=%v: result %+v", nulls, res)
		}
	}
}

// A stream without "usage" passes unchanged through a Strip reader, as
// does everything around the data: comments, event and id lines, retry.
func TestStripPassesTheRest(t *testing.T) {
	body := []byte(": keep-alive\n\nretry: 3000\n\nid: 1\nevent: message\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: not json\ndata: on two lines\n\n\n\n:comment\r\ndata:[DONE]\r\n\r\n")
	got, res := check(t, body, stripChat)
	if !bytes.Equal(got, body) {
		t.Fatalf("got\n%q\nwant\n%q", got, body)
	}
	if res.Reported || res.Output != 1 {
		t.Fatalf("result %+v, want Output 1 (the one delta)", res)
	}
}

// Other places for the usage member: first, alone, with its chunk's
// choices (recorded, then removed), among several data lines.
func TestStripMember(t *testing.T) {
	u := `{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}`
	cases := []struct{ name, in, want string }{
		{"first", `data: {"usage":null,"id":"x","choices":[]}` + "\n\n", `data: {"id":"x","choices":[]}` + "\n\n"},
		{"first-spaced", `data: { "usage" : null , "id":"x"}` + "\n\n", `data: {  "id":"x"}` + "\n\n"},
		{"middle", `data: {"id":"x","usage":null,"choices":[]}` + "\n\n", `data: {"id":"x","choices":[]}` + "\n\n"},
		{"alone", `data: {"usage":null}` + "\n\n", `data: {}` + "\n\n"},
		{"alone-spaced", `data: { "usage":null }` + "\n\n", `data: {  }` + "\n\n"},
		{"with-choices", `data: {"id":"x","choices":[{"delta":{"content":"ab"},"finish_reason":"stop"}],"usage":` + u + "}\n\n",
			`data: {"id":"x","choices":[{"delta":{"content":"ab"},"finish_reason":"stop"}]}` + "\n\n"},
		{"two-data-lines", "data: {\"id\":\"x\",\ndata: \"usage\":null}\n\n", "data: {\"id\":\"x\",\ndata: \"usage\":null}\n\n"},
		{"nested-only", `data: {"id":"x","choices":[{"delta":{"usage":null}}]}` + "\n\n", `data: {"id":"x","choices":[{"delta":{"usage":null}}]}` + "\n\n"},
		{"usage-in-text", `data: {"choices":[{"delta":{"content":"\"usage\":null"}}]}` + "\n\n", `data: {"choices":[{"delta":{"content":"\"usage\":null"}}]}` + "\n\n"},
		{"invalid", `data: {"usage":null,` + "\n\n", `data: {"usage":null,` + "\n\n"},
		{"usage-chunk-no-choices", `data: {"id":"x","usage":` + u + "}\n\n", `data: {"id":"x"}` + "\n\n"},
		{"usage-chunk", `data: {"id":"x","choices":[ ],"usage":` + u + "}\n\ndata: [DONE]\n\n", "data: [DONE]\n\n"},
		{"usage-chunk-with-event-line", "event: x\n" + `data: {"id":"x","choices":[],"usage":` + u + "}\n\n", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, res := check(t, []byte(c.in), stripChat)
			if string(got) != c.want {
				t.Fatalf("got\n%q\nwant\n%q", got, c.want)
			}
			if strings.Contains(c.in, u) && (!res.Reported || res.Usage != (usage.Usage{Input: 5, Output: 2})) {
				t.Fatalf("usage not recorded: %+v", res)
			}
		})
	}
}

// An event held past MaxEvent is released unmodified and stripping stops
// for the rest of the stream; the usage is still found.
func TestStripMaxEvent(t *testing.T) {
	f := chatForm{usage: true, nulls: true}
	p := chatChunks(f, 4)
	big := chatHead + `"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 600) + `"},"finish_reason":null}],"usage":null}`
	body := sse(f, append(append(p[:2:2], big), p[2:]...))
	o := stripChat
	o.MaxEvent = 500
	got, res := check(t, body, o)
	head := sse(chatForm{}, chatChunks(chatForm{}, 4)[:2])
	if !bytes.HasPrefix(got, head) || !bytes.Equal(got[len(head):], body[len(sse(f, p[:2])):]) {
		t.Fatalf("got\n%s", got)
	}
	if !res.Reported || res.Usage != chatUsage {
		t.Fatalf("result %+v", res)
	}
}

// An event longer than the client's buffer, or than what is copied ahead
// of a read, is edited all the same.
func TestStripLongEvent(t *testing.T) {
	f := chatForm{usage: true, nulls: true}
	long := chatHead + `"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("y", 20000) + `"},"finish_reason":null}],"usage":null}`
	p := chatChunks(f, 3)
	body := sse(f, append(append(p[:2:2], long), p[2:]...))
	want := bytes.ReplaceAll(body, []byte(`,"usage":null}`), []byte("}"))
	i := bytes.Index(want, []byte(`data: {"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion.chunk","created":1741569952,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_eb9dce56a8","choices":[],"usage"`))
	j := bytes.Index(want[i:], []byte("\n\n"))
	want = append(want[:i:i], want[i+j+2:]...)
	got, res := check(t, body, stripChat)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
	if !res.Reported || res.Usage != chatUsage {
		t.Fatalf("result %+v", res)
	}
}
