package usage_test

import (
	"bytes"
	"testing"
	"testing/iotest"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

// FuzzReader reads random bodies in random pieces, every API, stream or
// not, stripping or not, with the default bounds and with tiny ones: no
// panic; the output and the result do not depend on the pieces; without
// stripping the output is the input, and with it too when the input has
// no "usage".
func FuzzReader(f *testing.F) {
	seeds := [][]byte{
		chatStream(chatForm{usage: true, nulls: true}),
		chatStream(chatForm{usage: true, nulls: true, eol: "\r\n", spaced: true}),
		chatStream(chatForm{usage: true, eol: "\r", noSpace: true}),
		anthropicStream(),
		responsesStream("response.completed"),
		[]byte(`{"choices":[{"message":{"content":"Hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`),
		[]byte("{\"message\":{\"content\":\"a\"}}\n{\"done\":true,\"prompt_eval_count\":3,\"eval_count\":4}\n"),
		[]byte("data: {\"usage\":null,\"a\":[1,{\"b\":\"\\\"}\"}]}\r\n\r\ndata: {\"choices\":[],\"usage\":{}}\n\n"),
		[]byte("plain text"),
		[]byte("\r\r\n\n\r:x\rdata\revent:\xff\xfe\n\n"),
	}
	for i, s := range seeds {
		for flags := range uint8(8) {
			f.Add(s, uint64(i)*31+uint64(flags), uint8(i%6), flags)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, api uint8, flags uint8) {
		o := usage.Options{
			API:    usage.API(api % 7), // 6 is out of range: taken as Generic
			Strip:  flags&1 != 0,
			Stream: flags&2 != 0,
			Count:  countBytes,
		}
		if flags&4 != 0 {
			o.MaxText, o.MaxEvent, o.MaxBody = 1+int(seed%97), 1+int(seed%89), 1+int(seed%83)
		}
		out, res := run(t, bytes.NewReader(body), o)
		edits := o.Strip && o.Stream && (o.API == usage.OpenAIChat || o.API == usage.OpenAICompletions)
		if (!edits || !bytes.Contains(body, []byte("usage"))) && !bytes.Equal(out, body) {
			t.Fatalf("output differs from input:\n%q\n%q", out, body)
		}
		if len(out) > len(body) {
			t.Fatalf("output longer than input")
		}
		if !res.Complete || res.Output < 0 || res.Usage.Input < 0 || res.Usage.Output < 0 {
			t.Fatalf("result %+v", res)
		}
		for _, src := range []interface{ Read([]byte) (int, error) }{
			randomSplits(body, seed),
			iotest.OneByteReader(bytes.NewReader(body)),
		} {
			out2, res2 := run(t, src, o)
			if !bytes.Equal(out2, out) || res2 != res {
				t.Fatalf("pieces changed the outcome:\n%q %+v\n%q %+v", out2, res2, out, res)
			}
		}
	})
}
