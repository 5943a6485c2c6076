package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// FuzzReadResponse checks the head and body parser against net/http's
// http.ReadResponse: the same status, protocol, headers, length, framing,
// body bytes and trailers, or both reject.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: v\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 204 No Content\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 200 OK\r\nX-Folded: a\r\n  b\r\n\tc\r\n\r\n",
		"HTTP/1.1 200 OK\r\n Leading: space\r\n\r\n",
		"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
		"HTTP/1.1 200 OK\r\nx-lower-case: 1\r\nSpace Key: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"HTTP/1.1 +12 OK\r\n\r\n",
		"HTTP/2.0 200 OK\r\n\r\n",
		"HTTP/1.1 200\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
		"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
		"\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: \xff\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX:  v  \r\n\r\n",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, raw string, head bool) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		want, werr := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), &http.Request{Method: method})
		got, gerr := ReadResponse(bufio.NewReader(strings.NewReader(raw)), method)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("net/http error %v, h1 error %v", werr, gerr)
		}
		if werr != nil {
			return
		}
		// net/http adds Cache-Control to a Pragma: no-cache; h1 adds nothing.
		if _, ok := got.Header["Cache-Control"]; !ok && len(want.Header["Pragma"]) > 0 && want.Header["Pragma"][0] == "no-cache" {
			delete(want.Header, "Cache-Control")
		}
		if got.Status != want.Status || got.StatusCode != want.StatusCode || got.Proto != want.Proto ||
			got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor ||
			got.ContentLength != want.ContentLength || got.Close != want.Close ||
			!reflect.DeepEqual(got.TransferEncoding, want.TransferEncoding) {
			t.Fatalf("head differs:\n got %+v\nwant %+v", got, want)
		}
		if !equalHeader(got.Header, want.Header) {
			t.Fatalf("header differs:\n got %q\nwant %q", got.Header, want.Header)
		}
		if (got.Body == http.NoBody) != (want.Body == http.NoBody) {
			t.Fatalf("body presence differs: got %T, want %T", got.Body, want.Body)
		}
		wb, werr := io.ReadAll(want.Body)
		gb, gerr := io.ReadAll(got.Body)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(wb, gb) {
			t.Fatalf("body differs: got %q (%v), want %q (%v)", gb, gerr, wb, werr)
		}
		if werr == nil && !equalHeader(got.Trailer, want.Trailer) {
			t.Fatalf("trailer differs:\n got %q\nwant %q", got.Trailer, want.Trailer)
		}
	})
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || len(v) != len(w) {
			return false
		}
		for i := range v {
			if v[i] != w[i] {
				return false
			}
		}
	}
	return true
}
