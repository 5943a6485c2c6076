package usage_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/upstream/usage"
)

const benchChunks = 200

// replay gives the upstream's writes back one per Read, as a streaming
// response arrives: a 200-chunk stream in about 200 reads.
type replay struct {
	p [][]byte
	i int
}

func (r *replay) Read(b []byte) (int, error) {
	if r.i == len(r.p) {
		return 0, io.EOF
	}
	n := copy(b, r.p[r.i])
	r.i++
	return n, nil
}

func (r *replay) Close() error { return nil }

// benchEvents is a realistic chat stream of benchChunks content chunks,
// one event per piece.
func benchEvents(f chatForm) [][]byte {
	body := sse(f, chatChunks(f, benchChunks))
	return bytes.SplitAfter(body, []byte("\n\n"))
}

// proxyCopy copies as httputil.ReverseProxy does: a 32 KiB buffer, one
// write (and flush) per read.
func proxyCopy(dst io.Writer, src io.Reader, buf []byte) {
	for {
		n, err := src.Read(buf)
		if n > 0 {
			dst.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func benchCopy(b *testing.B, events [][]byte, wrap func(io.ReadCloser) io.ReadCloser) {
	buf := make([]byte, 32<<10)
	src := &replay{p: events}
	size := 0
	for _, e := range events {
		size += len(e)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		src.i = 0
		body := wrap(src)
		proxyCopy(io.Discard, body, buf)
		body.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/chunk")
}

// BenchmarkStreamPassthrough is the floor: the stream copied unwrapped.
func BenchmarkStreamPassthrough(b *testing.B) {
	benchCopy(b, benchEvents(chatForm{}), func(r io.ReadCloser) io.ReadCloser { return r })
}

// BenchmarkStream wraps without stripping: a stream without usage (the
// client did not ask, nor did the proxy) and one with OpenAI's usage form
// (the client asked: "usage":null in every chunk, then the usage chunk).
func BenchmarkStream(b *testing.B) {
	for _, bc := range []struct {
		name string
		f    chatForm
	}{
		{"plain", chatForm{}},
		{"include_usage", chatForm{usage: true, nulls: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			o := usage.Options{API: usage.OpenAIChat, Stream: true, Count: countBytes}
			benchCopy(b, benchEvents(bc.f), func(r io.ReadCloser) io.ReadCloser {
				return usage.NewReader(r, o, func(usage.Result) {})
			})
		})
	}
}

// BenchmarkStreamStrip wraps with stripping: "usage":null removed from
// every chunk, the usage chunk dropped.
func BenchmarkStreamStrip(b *testing.B) {
	o := usage.Options{API: usage.OpenAIChat, Stream: true, Strip: true, Count: countBytes}
	benchCopy(b, benchEvents(chatForm{usage: true, nulls: true}), func(r io.ReadCloser) io.ReadCloser {
		return usage.NewReader(r, o, func(usage.Result) {})
	})
}

// BenchmarkStreamFallback is a stream without usage, whose text is
// extracted and counted when it closes.
func BenchmarkStreamFallback(b *testing.B) {
	o := usage.Options{API: usage.OpenAIChat, Stream: true, Count: countBytes}
	benchCopy(b, benchEvents(chatForm{}), func(r io.ReadCloser) io.ReadCloser {
		return usage.NewReader(r, o, func(res usage.Result) {
			if res.Output == 0 {
				b.Fatal("no output counted")
			}
		})
	})
}

// BenchmarkJSON reads a JSON answer of a few sizes, its usage at the end,
// in 32 KiB reads.
func BenchmarkJSON(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 8 << 20} {
		var body []byte
		body = append(body, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		for len(body) < size {
			body = append(body, "lorem ipsum dolor sit amet "...)
		}
		body = append(body, `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2000,"total_tokens":2010}}`...)
		var events [][]byte
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			events = append(events, rest[:n])
			rest = rest[n:]
		}
		b.Run(byteSize(size), func(b *testing.B) {
			o := usage.Options{API: usage.OpenAIChat, Count: countBytes}
			benchCopy(b, events, func(r io.ReadCloser) io.ReadCloser {
				return usage.NewReader(r, o, func(res usage.Result) {
					if !res.Reported {
						b.Fatal("no usage")
					}
				})
			})
		})
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// BenchmarkProxy is the end-to-end cost: a 200-chunk stream through
// httputil.ReverseProxy from a local upstream that flushes every chunk, to
// a client reading it all, unwrapped and wrapped.
func BenchmarkProxy(b *testing.B) {
	events := benchEvents(chatForm{usage: true, nulls: true})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, e := range events {
			w.Write(e)
			rc.Flush()
		}
	}))
	defer upstream.Close()
	target, _ := url.Parse(upstream.URL)
	for _, bc := range []struct {
		name string
		wrap func(*http.Response) error
	}{
		{"passthrough", func(*http.Response) error { return nil }},
		{"wrapped", func(res *http.Response) error {
			res.Body = usage.NewReader(res.Body, usage.Options{API: usage.OpenAIChat, Stream: true, Count: countBytes}, func(usage.Result) {})
			return nil
		}},
		{"wrapped-strip", func(res *http.Response) error {
			res.Body = usage.NewReader(res.Body, usage.Options{API: usage.OpenAIChat, Stream: true, Strip: true, Count: countBytes}, func(usage.Result) {})
			return nil
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rp := &httputil.ReverseProxy{
				Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(target) },
				ModifyResponse: bc.wrap,
				FlushInterval:  -1,
			}
			front := httptest.NewServer(rp)
			defer front.Close()
			client := front.Client()
			b.ReportAllocs()
			for b.Loop() {
				res, err := client.Get(front.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(events)), "ns/chunk")
		})
	}
}
