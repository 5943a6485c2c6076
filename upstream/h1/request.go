package h1

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// MaxInline is the largest body of known length that is written with the
// request head in one write; a longer one, or one of unknown length, is
// streamed after the head.
const MaxInline = 64 << 10

// streamChunk is the most of a streamed body read per write.
const streamChunk = 32 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// outgoing is a request ready to write: its head, with its body when
// inline.
type outgoing struct {
	buf         *[]byte
	body        io.Reader // streamed after the head; nil when inline or none
	length      int64     // streamed with Content-Length; -1: chunked
	bodyStarted bool      // a byte of a streamed body was read
}

func (o *outgoing) free() {
	if cap(*o.buf) <= 4*MaxInline {
		*o.buf = (*o.buf)[:0]
		bufs.Put(o.buf)
	}
}

// prepare builds req's head as net/http's Request.write does for a
// transport (Host from req.Host or the URL, User-Agent only as given,
// Content-Length or chunked from req.ContentLength, the header as it is)
// and reads a small body of known length into it.
func prepare(req *http.Request) (*outgoing, error) {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validToken(method) {
		return nil, fmt.Errorf("h1: invalid method %q", method)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !validValue(host) || host == "" {
		return nil, errors.New("h1: invalid Host header")
	}
	out := &outgoing{buf: bufs.Get().(*[]byte), length: -1}
	b := (*out.buf)[:0]
	b = append(b, method...)
	b = append(b, ' ')
	start := len(b)
	if req.URL.Opaque != "" {
		b = append(b, req.URL.RequestURI()...)
	} else {
		p := req.URL.EscapedPath()
		if p == "" {
			p = "/"
		}
		b = append(b, p...)
		if req.URL.ForceQuery || req.URL.RawQuery != "" {
			b = append(b, '?')
			b = append(b, req.URL.RawQuery...)
		}
	}
	for _, c := range b[start:] {
		if c <= ' ' || c == 0x7f {
			*out.buf = b
			out.free()
			return nil, errors.New("h1: can't write control character in Request.URL")
		}
	}
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	if ua := req.Header["User-Agent"]; len(ua) > 0 && ua[0] != "" {
		b = appendField(b, "User-Agent", ua[0])
	}
	if req.Close && !containsToken(req.Header["Connection"], "close") {
		b = append(b, "Connection: close\r\n"...)
	}

	// The body: none, inline, streamed with a length, or chunked.
	var body io.Reader = req.Body
	if req.Body == nil || req.Body == http.NoBody {
		body = nil
	}
	length := req.ContentLength
	if body != nil && length == 0 {
		// Unknown length: net/http probes a byte too.
		var one [1]byte
		n, err := io.ReadFull(body, one[:])
		if err == io.EOF {
			body = nil
		} else if err != nil {
			*out.buf = b
			out.free()
			return nil, err
		} else {
			body, length = io.MultiReader(bytesReader(one[:n]), body), -1
		}
	}
	if body == nil {
		length = 0
	}
	switch {
	case length > 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, length, 10)
		b = append(b, "\r\n"...)
	case length < 0:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	case method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch:
		b = append(b, "Content-Length: 0\r\n"...)
	}
	for k, vv := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if !validToken(k) {
			*out.buf = b
			out.free()
			return nil, fmt.Errorf("h1: invalid header field name %q", k)
		}
		for _, v := range vv {
			if !validValue(v) {
				*out.buf = b
				out.free()
				return nil, fmt.Errorf("h1: invalid header field value for %q", k)
			}
			b = appendField(b, k, v)
		}
	}
	b = append(b, "\r\n"...)

	if length > 0 && length <= MaxInline {
		n := len(b)
		b = slices.Grow(b, int(length))[:n+int(length)]
		got, err := io.ReadFull(body, b[n:])
		if err == nil {
			// More than ContentLength is an error, as in net/http.
			var one [1]byte
			if m, _ := body.Read(one[:]); m > 0 {
				err = fmt.Errorf("h1: ContentLength=%d with a longer body", length)
			}
		} else if err == io.ErrUnexpectedEOF || err == io.EOF {
			err = fmt.Errorf("h1: ContentLength=%d with Body length %d", length, got)
		}
		*out.buf = b
		if err != nil {
			out.free()
			return nil, err
		}
		return out, nil
	}
	*out.buf = b
	if length != 0 {
		out.body, out.length = body, length
	}
	return out, nil
}

func bytesReader(p []byte) io.Reader {
	r := &sliceReader{p: append([]byte(nil), p...)}
	return r
}

type sliceReader struct{ p []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.p) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.p)
	r.p = r.p[n:]
	return n, nil
}

func appendField(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	// net/http trims the value's surrounding spaces and tabs.
	b = append(b, trim(v)...)
	return append(b, "\r\n"...)
}

// writeTo writes the request on cn: the head (with an inline body) in one
// write, then a streamed body.
func (o *outgoing) writeTo(cn *Conn) error {
	if _, err := cn.Write(*o.buf); err != nil {
		return err
	}
	if o.body == nil {
		return nil
	}
	scratch := bufs.Get().(*[]byte)
	defer func() {
		*scratch = (*scratch)[:0]
		bufs.Put(scratch)
	}()
	if cap(*scratch) < streamChunk+32 {
		*scratch = make([]byte, 0, streamChunk+32)
	}
	buf := (*scratch)[:streamChunk+32]
	left := o.length
	for {
		// Room before the data for a chunk's size line.
		const pre = 18
		want := streamChunk
		if left >= 0 && int64(want) > left {
			want = int(left)
		}
		n, rerr := o.body.Read(buf[pre : pre+want])
		if n > 0 {
			o.bodyStarted = true
			frame := buf[pre : pre+n]
			if left < 0 {
				size := strconv.AppendInt(buf[:0:pre], int64(n), 16)
				size = append(size, "\r\n"...)
				start := pre - len(size)
				copy(buf[start:], size)
				frame = append(buf[start:pre+n], "\r\n"...)
			} else {
				left -= int64(n)
			}
			if _, err := cn.Write(frame); err != nil {
				return err
			}
		}
		if left == 0 {
			return nil
		}
		if rerr == io.EOF {
			if left > 0 {
				return fmt.Errorf("h1: ContentLength=%d with a shorter body", o.length)
			}
			_, err := cn.Write([]byte("0\r\n\r\n"))
			return err
		}
		if rerr != nil {
			return rerr
		}
	}
}

// validToken reports whether s is an RFC 7230 token (a method, a field
// name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			return false
		}
	}
	return true
}

// validValue reports whether s may be a field value: no control bytes but
// tab (as httpguts.ValidHeaderFieldValue).
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
