package pdf

import (
	"bytes"
	"errors"
	"time"
)

// Limits bound the work of Read. A zero or negative field takes its
// default: DefaultMaxDecompressed, DefaultTimeout, DefaultMaxPages.
type Limits struct {
	MaxDecompressed int64         // total bytes all stream decoders may produce; past it Read returns ErrBound
	Timeout         time.Duration // wall time; past it Read returns ErrBound
	MaxPages        int           // pages read for text; pages beyond still count in Result.Pages
}

// The defaults of Limits.
const (
	DefaultMaxDecompressed = 32 << 20
	DefaultTimeout         = 2 * time.Second
	DefaultMaxPages        = 100
)

func (l Limits) withDefaults() Limits {
	if l.MaxDecompressed <= 0 {
		l.MaxDecompressed = DefaultMaxDecompressed
	}
	if l.Timeout <= 0 {
		l.Timeout = DefaultTimeout
	}
	if l.MaxPages <= 0 {
		l.MaxPages = DefaultMaxPages
	}
	return l
}

// Result is what Read found.
type Result struct {
	Pages  int   // page count (at least 1 for any input Read was given: an unreadable file is one page)
	Unread int64 // bytes that could not be read as text (a file or a stream the reader could not interpret; a stream it could not decode counts as its worst expansion, so this may exceed the file's size); the caller costs them by a size rule
}

// ErrBound reports that a bound of Limits was passed: the caller treats the
// PDF as over any token cap.
var ErrBound = errors.New("pdf: over the decompression or time bound")

// Read hands the text of data's pages to sink in pieces, in page order. An
// error from sink stops Read at once and is returned as is (errors.Is must
// match it). Read never panics and never returns any other error than
// sink's or ErrBound: a malformed or encrypted PDF is costed through Result
// (Pages>=1; whatever could not be read as text, up to the whole file,
// counts in Unread) and the text that could be read, never an error.
//
// sink must not keep text after it returns: Read reuses the buffer.
func Read(data []byte, lim Limits, sink func(text []byte) error) (Result, error) {
	res, _, err := readPath(data, lim, sink)
	return res, err
}

func readPath(data []byte, lim Limits, sink func(text []byte) error) (res Result, how path, err error) {
	lim = lim.withDefaults()
	b := newBudget(lim, time.Now())
	out := &textOut{sink: sink, buf: make([]byte, 0, outChunk+64)}
	defer func() {
		if r := recover(); r != nil {
			// A bug of this package: cost the whole file by size.
			res, err = Result{Pages: max(res.Pages, 1), Unread: int64(len(data))}, nil
			if out.err != nil {
				err = out.err
			} else if b.over {
				err = ErrBound
			}
		}
	}()
	return finish(data, lim, b, out)
}

// finish runs read and maps its outcome to Read's contract. It does not
// recover: the fuzz target calls it to see panics that Read would hide.
func finish(data []byte, lim Limits, b *budget, out *textOut) (Result, path, error) {
	res, how, err := read(data, lim, b, out)
	switch {
	case out.err != nil:
		return res, how, out.err
	case err != nil || b.over:
		// Every error but the sink's is a passed bound.
		return res, how, ErrBound
	}
	res.Pages = max(res.Pages, 1)
	// Sizes count once (the library's and the scan's may overlap); the
	// estimates of undecodable streams come on top.
	if res.Unread > int64(len(data))+b.reserved {
		res.Unread = int64(len(data)) + b.reserved
	}
	return res, how, nil
}

// path says how read costed a file (for the tests).
type path int

const (
	viaNothing path = iota // not a PDF
	viaLibrary
	viaScan
)

func read(data []byte, lim Limits, b *budget, out *textOut) (Result, path, error) {
	s, err := scanFile(data, b)
	if err != nil {
		return Result{}, viaScan, err
	}
	if !s.header && len(s.streams) == 0 {
		return Result{Pages: 1, Unread: int64(len(data))}, viaNothing, nil
	}
	if v, patch, ok := libraryView(data); ok {
		switch err := checkStructure(v, b); {
		case err == nil:
			l := newLibReader(b, lim, out)
			ok, err := l.read(v, patch)
			res := l.res
			if err != nil || ok && !l.degraded {
				return res, viaLibrary, err
			}
			if ok {
				// The library stumbled after writing text: add what the
				// scan finds, so that the cost never falls below it.
				sres, err := s.fallback(b, out)
				res.Unread += sres.Unread
				res.Pages = max(res.Pages, sres.Pages)
				return res, viaLibrary, err
			}
		case errors.Is(err, errOver):
			return Result{}, viaLibrary, err
		}
	}
	res, err := s.fallback(b, out)
	return res, viaScan, err
}

// libraryView returns the part of data the library should read (up to the
// last %%EOF, so that trailing bytes do not hide it) and whether the header
// must be shown as %PDF-1.7 (the library knows versions 1.0 to 1.7 only).
func libraryView(data []byte) ([]byte, bool, bool) {
	if len(data) < 10 || !bytes.HasPrefix(data, []byte("%PDF-")) ||
		!isDigit(data[5]) || data[6] != '.' || !isDigit(data[7]) ||
		data[8] != '\r' && data[8] != '\n' {
		return nil, false, false
	}
	patch := data[5] != '1' || data[7] > '7'
	if _, err := libStartxref(data); err == nil {
		return data, patch, true
	}
	tail := max(0, len(data)-1024)
	k := bytes.LastIndex(data[tail:], []byte("%%EOF"))
	if k < 0 {
		return nil, false, false
	}
	end := tail + k + 5
	for end < len(data) && end < tail+k+7 && (data[end] == '\r' || data[end] == '\n') {
		end++
	}
	return data[:end], patch, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
