package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"time"
)

const (
	// memBodyMax is the largest body held in memory; a larger one is
	// spooled to an unlinked temporary file, so memory does not grow with
	// concurrent large uploads.
	memBodyMax = 256 << 10
	// bodyReadTimeout bounds the time a client may take to send a protected
	// body (a 11 MiB body needs ~100 KB/s), so slow senders cannot hold
	// connections and goroutines indefinitely.
	bodyReadTimeout = 120 * time.Second
)

// errBodyTooLarge is a body over MAX_BODY_BYTES.
var errBodyTooLarge = errors.New("body too large")

// spooled is a request body read in full, in memory or in a temporary file
// already unlinked (it disappears when closed, or if the process dies).
type spooled struct {
	mem   []byte
	file  *os.File
	size  int64
	unmap func() // set once the file is mapped (bytes)
}

// readBody reads r's body within max bytes: a declared Content-Length over
// max is refused before any byte is read, a chunked body is cut at max+1.
// The read deadline is the wall clock's, not the proxy's injected one: a
// deadline is handed to the network poller, and one in the past (a test
// clock) would cancel the request the moment the server's background read
// saw it.
func readBody(w http.ResponseWriter, r *http.Request, max int64) (*spooled, error) {
	if r.ContentLength > max {
		return nil, errBodyTooLarge
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyReadTimeout)) // unsupported writers (tests) just have no deadline
	defer rc.SetReadDeadline(time.Time{})
	return readWithin(w, r, max)
}

// readWithin is readBody's reading, under whatever read deadline the
// caller set.
func readWithin(w http.ResponseWriter, r *http.Request, max int64) (*spooled, error) {
	body := http.MaxBytesReader(w, r.Body, max)
	hint := 4 << 10
	if r.ContentLength >= 0 {
		hint = int(min(r.ContentLength, memBodyMax)) + 1 // +1: see EOF without growing
	}
	mem, err := readUpTo(body, memBodyMax+1, hint)
	if errors.Is(err, io.EOF) {
		return &spooled{mem: mem, size: int64(len(mem))}, nil
	}
	if err != nil {
		return nil, bodyError(err)
	}
	buf := bytes.NewBuffer(mem)
	n := int64(len(mem))
	// Larger than memory allows: spool to disk.
	f, err := os.CreateTemp("", "ratelimit-proxy-body-*")
	if err != nil {
		return nil, fmt.Errorf("spooling the body: %w", err)
	}
	os.Remove(f.Name()) // unlinked: nothing is left behind, whatever happens
	s := &spooled{file: f}
	if _, err := f.Write(buf.Bytes()); err != nil {
		s.close()
		return nil, fmt.Errorf("spooling the body: %w", err)
	}
	rest, err := io.Copy(f, body)
	if err != nil {
		s.close()
		return nil, bodyError(err)
	}
	s.size = n + rest
	return s, nil
}

func bodyError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errBodyTooLarge
	}
	return fmt.Errorf("reading the body: %w", err)
}

// bytes is the whole body, to be read in place and never written: the
// memory it was read into, or its spool file mapped (valid until close).
func (s *spooled) bytes() []byte {
	if s.file == nil || s.unmap != nil {
		return s.mem
	}
	b, unmap, err := mapFile(s.file, s.size)
	if err != nil { // no mapping to be had (address space, limits): read it
		b, unmap = make([]byte, s.size), func() {}
		n, _ := s.file.ReadAt(b, 0)
		b = b[:n]
	}
	s.mem, s.unmap = b, unmap
	return b
}

// upstreamBody is what the upstream request sends: the bytes as received.
func (s *spooled) upstreamBody() io.ReadCloser {
	if s.file != nil {
		return io.NopCloser(io.NewSectionReader(s.file, 0, s.size))
	}
	return memBody{bytes.NewReader(s.mem)}
}

// memBody is an in-memory request body. outgoingBody recognises it, so
// that the transport gets a NopCloser around a bytes.Reader, which it
// writes with the headers in one syscall.
type memBody struct{ *bytes.Reader }

func (memBody) Close() error { return nil }

// outgoingBody is upstream.Options.OutgoingBody.
func outgoingBody(in *http.Request) io.ReadCloser {
	if b, ok := in.Body.(memBody); ok {
		return io.NopCloser(b.Reader)
	}
	return nil
}

func (s *spooled) close() {
	if s.unmap != nil {
		s.unmap()
	}
	if s.file != nil {
		s.file.Close()
	}
}

// oversizedFile reports whether a file part of a multipart body is over
// maxFile bytes. A body that is not valid multipart is an error; other
// content types have no file parts.
func oversizedFile(contentType string, body []byte, maxFile int64) (bool, error) {
	if len(contentType) < 10 || !strings.EqualFold(contentType[:10], "multipart/") {
		return false, nil
	}
	mediaType, params, _ := mime.ParseMediaType(contentType)
	if mediaType != "multipart/form-data" {
		return false, nil
	}
	if params["boundary"] == "" {
		return false, errors.New("multipart body without a boundary parameter")
	}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, errors.New("invalid multipart body: malformed or truncated part")
		}
		n, err := io.Copy(io.Discard, io.LimitReader(p, maxFile+1))
		if err != nil {
			return false, errors.New("invalid multipart body: truncated part")
		}
		// A part naming a filename is a file even when Go's parser rejects
		// the name (filename=a b.pdf, unquoted): lenient parsers read it.
		if n > maxFile && (p.FileName() != "" || strings.Contains(strings.ToLower(p.Header.Get("Content-Disposition")), "filename")) {
			return true, nil
		}
		if n > maxFile { // a huge non-file field: skip the rest of it
			if _, err := io.Copy(io.Discard, p); err != nil {
				return false, errors.New("invalid multipart body: truncated part")
			}
		}
	}
}

// readUpTo reads r until EOF (returned as io.EOF, with the data) or until
// limit bytes (returned with a nil error), growing from hint but never
// past limit: a body just over the in-memory threshold must not double
// the buffer to hold one more byte.
func readUpTo(r io.Reader, limit, hint int) ([]byte, error) {
	b := make([]byte, 0, min(hint, limit))
	for {
		if len(b) == cap(b) {
			if len(b) == limit {
				return b, nil
			}
			nb := make([]byte, len(b), min(max(2*cap(b), 512), limit))
			copy(nb, b)
			b = nb
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			return b, err
		}
	}
}
