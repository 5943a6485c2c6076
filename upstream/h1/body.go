package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"sync"
)

type bodyKind uint8

const (
	bodyLength     bodyKind = iota + 1 // Content-Length bytes
	bodyChunked                        // chunked coding, then trailers
	bodyUntilClose                     // until the peer closes
)

var (
	errBodyClosed = errors.New("h1: read on closed response body")
	errTrailerEOF = errors.New("h1: unexpected EOF reading trailer")
)

// Body is a response body read from its connection's buffer. Read to its
// end (io.EOF), it gives the connection back to the pool at once (before
// Close); closed before its end, it closes the connection, so that the
// rest of the response can never be read as the next one.
type Body struct {
	br     *bufio.Reader
	res    *http.Response // for trailers
	cn     *Conn          // nil when read by ReadResponse alone
	kind   bodyKind
	left   int64     // bodyLength: bytes still to read
	chunks io.Reader // bodyChunked: httputil's chunked reader on br
	// chunksRead: Read has used chunks, whose place in the framing Push's
	// decoder cannot take over (push_linux.go).
	chunksRead bool

	rmu  sync.Mutex // held by Read: a Close during a Read does not linger
	mu   sync.Mutex // err, against a Close from another goroutine
	err  error      // sticky: io.EOF once read to the end
	once sync.Once  // the connection is released once
}

// Buffered returns how many bytes of the body can be read now without
// waiting on the connection: for a chunked body this counts the framing
// still buffered too, so it is a hint that more than 0 bytes are there.
func (b *Body) Buffered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil || b.br == nil {
		return 0
	}
	n := b.br.Buffered()
	if b.kind == bodyLength && int64(n) > b.left {
		n = int(b.left)
	}
	return n
}

// Read implements io.Reader.
func (b *Body) Read(p []byte) (int, error) {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	b.mu.Lock()
	err := b.err
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	var n int
	switch b.kind {
	case bodyLength:
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err = b.br.Read(p)
		b.left -= int64(n)
		if b.left == 0 {
			err = io.EOF // with the last bytes: the connection is free now
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	case bodyChunked:
		b.chunksRead = true
		n, err = b.chunks.Read(p)
		if err == io.EOF {
			if terr := b.readTrailer(b.br); terr != nil {
				err = terr
			}
		}
	default:
		n, err = b.br.Read(p)
	}
	if err != nil {
		if err != io.EOF && b.cn != nil {
			left := b.kind == bodyLength && b.cn.ctx != nil && b.cn.ctx.Err() != nil &&
				errors.Is(err, os.ErrDeadlineExceeded)
			err = b.cn.readErr(err, false)
			if left { // the client left midway: the rest may linger
				b.abandon(err)
				return n, err
			}
		}
		b.finish(err, err == io.EOF && b.kind != bodyUntilClose)
	}
	return n, err
}

// abandon ends a Content-Length body before its end: the connection
// lingers to discard the rest when it is small (linger.go), or is closed.
func (b *Body) abandon(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
	b.once.Do(func() {
		if b.res.Close || eventStream(b.res) || !b.cn.lingerBody(b.left) {
			b.cn.release(false)
		}
	})
}

// finish records err as the body's end and releases the connection:
// back to the pool when reuse, closed otherwise.
func (b *Body) finish(err error, reuse bool) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
	b.once.Do(func() {
		if b.cn != nil {
			b.cn.release(reuse && !b.res.Close)
		}
	})
}

// Close implements io.Closer. A body not read to its end closes its
// connection, unless its rest is at most Options.LingerBytes of a
// Content-Length: then the connection lingers to discard it (linger.go).
func (b *Body) Close() error {
	if b.rmu.TryLock() {
		b.mu.Lock()
		done := b.err != nil
		b.mu.Unlock()
		if !done && b.kind == bodyLength {
			if b.left <= int64(b.br.Buffered()) {
				// The rest is already in the buffer (a client that left
				// just as the answer came): read past it and keep the
				// connection.
				b.br.Discard(int(b.left))
				b.left = 0
				b.finish(io.EOF, true)
			} else if b.cn != nil {
				b.abandon(errBodyClosed)
			}
		}
		b.rmu.Unlock()
	}
	b.finish(errBodyClosed, false)
	b.mu.Lock()
	b.err = errBodyClosed
	b.mu.Unlock()
	return nil
}

// readTrailer reads what follows the last chunk, as net/http does: a
// blank line, or trailer fields merged into the response's Trailer.
func (b *Body) readTrailer(br *bufio.Reader) error {
	buf, err := br.Peek(2)
	if bytes.Equal(buf, crlf) {
		br.Discard(2)
		return nil
	}
	if len(buf) < 2 {
		return errTrailerEOF
	}
	if err != nil {
		return err
	}
	if !upcomingDoubleCRLF(br) {
		return errors.New("h1: suspiciously long trailer after chunked body")
	}
	hdr, err := textproto.NewReader(br).ReadMIMEHeader()
	if err != nil {
		if err == io.EOF {
			return errTrailerEOF
		}
		return err
	}
	if b.res.Trailer == nil {
		b.res.Trailer = http.Header(hdr)
		return nil
	}
	for k, vv := range hdr {
		b.res.Trailer[k] = vv
	}
	return nil
}

var (
	crlf       = []byte("\r\n")
	doubleCRLF = []byte("\r\n\r\n")
)

func upcomingDoubleCRLF(r *bufio.Reader) bool {
	for n := 4; ; n++ {
		buf, err := r.Peek(n)
		if bytes.HasSuffix(buf, doubleCRLF) {
			return true
		}
		if err != nil {
			return false
		}
	}
}
