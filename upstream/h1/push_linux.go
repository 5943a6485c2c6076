package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/quiet"
)

// Push copies a streamed body to w as it comes off the connection,
// calling flush each time the connection has nothing more to read, and
// ends the body as a Read to its end would: trailers into the response,
// the connection back to the pool or closed. ok is false, and nothing was
// read, when the body cannot be pushed (TLS, a Content-Length body, a
// body already ended, a chunked one partly read already, or not on a
// pooled connection): the caller reads it.
//
// Why not Read: a Read that finds the socket empty costs a read(2) that
// fails with EAGAIN before the goroutine waits for the poller, and a
// stream of small events pays that once an event (0.9 a chunk, measured
// under MODE=sse). Push reads inside the connection's RawConn.Read: after
// a read that did not fill buf the socket was drained, so it waits for the
// poller at once, and the next read(2) is one that finds bytes. The
// poller's readiness is edge-triggered and kept from the first wait on, so
// bytes that come while the last ones are written out are not missed.
func (b *Body) Push(w io.Writer, flush func() error, buf []byte) (ok bool, err error) {
	if b.cn == nil || b.cn.alive.raw == nil || len(buf) == 0 ||
		b.kind != bodyChunked && b.kind != bodyUntilClose {
		return false, nil
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	b.mu.Lock()
	err = b.err
	b.mu.Unlock()
	if err != nil || b.chunksRead {
		return false, nil // ended or closed (a Read says which), or mid-chunk
	}
	s := pushing{b: b, w: w, flush: flush}

	// What came with the head is in the read buffer.
	for b.br.Buffered() > 0 && !s.done && s.err == nil {
		n := copy(buf, peekAll(b.br))
		b.br.Discard(n)
		s.feed(buf[:n])
	}
	if !s.done && s.err == nil {
		if err := b.pushReads(&s, buf); err != nil {
			err = b.cn.readErr(err, false)
			b.finish(err, false)
			return true, err
		}
	}
	if s.err != nil {
		// A write failed. The body ends with its error, and its connection
		// is closed (as Close would): the push has its place in the
		// framing, which a Read would take afresh.
		b.finish(s.err, false)
		return true, s.err
	}
	if s.decodeErr != nil {
		b.finish(s.decodeErr, false)
		return true, s.decodeErr
	}
	if b.kind == bodyUntilClose {
		b.finish(io.EOF, false)
		return true, nil
	}
	reuse, err := b.pushTrailer(s.rest)
	if err != nil {
		b.finish(err, false)
		return true, err
	}
	b.finish(io.EOF, reuse)
	return true, nil
}

// pushProbe is how long Push waits on the poller before it reads all the
// same. A read that did not fill the buffer drained the data, but not
// necessarily an end of stream behind it: a FIN or a reset that came with
// the last bytes was signalled with them, and is not signalled again. An
// upstream that closes mid-stream is noticed within pushProbe, not when
// TCP keepalive gives up a minute later. A stream waits between reads;
// this costs an idle stream five reads a second.
const pushProbe = 200 * time.Millisecond

// pushReads reads the connection into buf and feeds s until the body
// ends, a write fails or a read does.
func (b *Body) pushReads(s *pushing, buf []byte) error {
	var rerr error
	ctx := b.cn.ctx // the request's: its cancellation aborts the connection
	read := func(fd uintptr) bool {
		for {
			n, errno := quiet.Read(fd, buf)
			switch {
			case errno == syscall.EAGAIN:
				s.flushNow() // a spurious wake-up, a probe, or buf was filled
				return false
			case errno != 0:
				rerr = os.NewSyscallError("read", errno)
				return true
			case n == 0:
				if b.kind == bodyUntilClose {
					s.done = true
				} else {
					rerr = io.ErrUnexpectedEOF
				}
				return true
			}
			if s.feed(buf[:n]); s.done || s.err != nil {
				return true
			}
			if n < len(buf) { // drained: wait without reading
				s.flushNow()
				return false
			}
			// Reading on without a wait: the abort's past deadline is seen
			// only by a wait, and an upstream that outpaces the client
			// (a full socket queue) may never leave one to wait for.
			if ctx != nil && ctx.Err() != nil {
				rerr = ctx.Err()
				return true
			}
		}
	}
	cn := b.cn
	defer cn.setReadDeadline(time.Time{}) // the pool's connections have none
	for {
		if !cn.setReadDeadline(time.Now().Add(pushProbe)) {
			return cn.readErr(context.Canceled, false) // aborted
		}
		err := cn.alive.raw.Read(read)
		switch {
		case rerr != nil:
			return rerr
		case err == nil:
			return nil
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return err
		}
	}
}

// pushing is one Push under way.
type pushing struct {
	b       *Body
	w       io.Writer
	flush   func() error
	dec     chunkDecoder
	pending bool   // written since the last flush
	done    bool   // the body's end: the last chunk's line, or EOF
	rest    []byte // after the last chunk's line, what the read brought (in buf)
	err     error  // writing to w
	// decodeErr is a malformed chunked coding: the data before it was
	// written, as net/http's reader returns it before its error.
	decodeErr error
}

// feed takes bytes read off the connection: their data goes to w.
func (s *pushing) feed(p []byte) {
	data, used := len(p), len(p)
	if s.b.kind == bodyChunked {
		var err error
		data, used, err = s.dec.decode(p)
		if err != nil {
			s.decodeErr, s.done = err, true
		} else if s.dec.state == chunkLast {
			s.done = true
			s.rest = p[used:] // buf is read into no more
		}
	}
	if data > 0 {
		n, err := s.w.Write(p[:data])
		if err == nil && n != data {
			err = io.ErrShortWrite
		}
		s.err, s.pending = err, true
	}
}

func (s *pushing) flushNow() {
	if s.pending && s.flush != nil && s.err == nil {
		s.flush() // a client that left fails the next write
	}
	s.pending = false
}

// pushTrailer reads what follows the last chunk, starting with rest and
// then what the connection's read buffer still holds (a buf smaller than
// what came with the head leaves some there): reuse is whether the
// connection ends exactly there.
func (b *Body) pushTrailer(rest []byte) (reuse bool, err error) {
	if len(rest) >= 2 && bytes.Equal(rest[:2], crlf) {
		// Anything after it is unasked for.
		return len(rest) == 2 && b.br.Buffered() == 0, nil
	}
	// Trailer fields, or a CRLF still on its way: rare enough to read
	// through a buffer of their own, which must end empty to keep the
	// connection.
	left := bytes.NewReader(rest)
	br := bufio.NewReaderSize(io.MultiReader(left, b.br), b.br.Size())
	if err := b.readTrailer(br); err != nil {
		return false, b.cn.readErr(err, false)
	}
	return br.Buffered() == 0 && left.Len() == 0 && b.br.Buffered() == 0, nil
}

// peekAll returns what br holds, without reading.
func peekAll(br *bufio.Reader) []byte {
	p, _ := br.Peek(br.Buffered())
	return p
}
