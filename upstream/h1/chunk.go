package h1

import (
	"bytes"
	"errors"
)

// maxChunkLine bounds a chunk-size line without its CRLF, as net/http's
// chunked reader does (its lines must be shorter).
const maxChunkLine = 4096

var (
	errChunkLineLong = errors.New("h1: chunk-size line too long")
	errChunkBareLF   = errors.New("h1: chunked line ends with bare LF")
	errChunkCR       = errors.New("h1: invalid CR in chunked line")
	errChunkHex      = errors.New("h1: malformed chunk size")
	errChunkLarge    = errors.New("h1: chunk size too large")
	errChunkEnd      = errors.New("h1: malformed chunked encoding")
	errChunkExcess   = errors.New("h1: chunked encoding contains too much non-data")
)

type chunkState uint8

const (
	chunkSize    chunkState = iota // in a chunk-size line
	chunkData                      // in a chunk's data
	chunkDataEnd                   // in the CRLF after a chunk's data
	chunkLast                      // past the last chunk's line: the trailer follows
)

// chunkDecoder decodes the chunked coding from bytes as they come off a
// connection, in place and across reads. It accepts what net/http's
// chunked reader accepts (FuzzChunkDecoder compares the two): size lines
// ended by CRLF with no other CR and shorter than maxChunkLine, extensions
// dropped, at most 16 hex digits, and the same bound on framing overhead.
// It exists because net/http's reader needs a bufio.Reader to pull from,
// while Push must be told of bytes already read (push_linux.go).
type chunkDecoder struct {
	state  chunkState
	line   []byte // a size line split across reads, so far
	n      uint64 // data bytes left in the chunk
	crSeen bool   // chunkDataEnd: the CR came
	excess int64  // framing overhead beyond what the data pays for
}

// decode decodes p in place: the data it holds moves to p[:data]. It
// stops after the last chunk's line, at p[used:] (the trailer's start);
// otherwise used is len(p). A malformed coding returns the data before it
// and the error.
func (d *chunkDecoder) decode(p []byte) (data, used int, err error) {
	i := 0
	for i < len(p) {
		switch d.state {
		case chunkSize:
			nl := bytes.IndexByte(p[i:], '\n')
			if nl < 0 {
				if len(d.line)+len(p)-i > maxChunkLine {
					return data, i, errChunkLineLong
				}
				d.line = append(d.line, p[i:]...)
				return data, len(p), nil
			}
			line := p[i : i+nl+1]
			if len(d.line) > 0 {
				d.line = append(d.line, line...)
				line = d.line
			}
			i += nl + 1
			if err := d.sizeLine(line); err != nil {
				return data, i, err
			}
			d.line = d.line[:0]
			if d.state == chunkLast {
				return data, i, nil
			}
		case chunkData:
			m := len(p) - i
			if uint64(m) > d.n {
				m = int(d.n)
			}
			copy(p[data:], p[i:i+m])
			data, i, d.n = data+m, i+m, d.n-uint64(m)
			if d.n == 0 {
				d.state, d.crSeen = chunkDataEnd, false
			}
		case chunkDataEnd:
			c := p[i]
			i++
			switch {
			case !d.crSeen && c == '\r':
				d.crSeen = true
			case d.crSeen && c == '\n':
				d.state = chunkSize
			default:
				return data, i, errChunkEnd
			}
		case chunkLast:
			return data, i, nil
		}
	}
	return data, i, nil
}

// sizeLine reads a whole chunk-size line, LF included.
func (d *chunkDecoder) sizeLine(line []byte) error {
	cr := bytes.IndexByte(line, '\r')
	switch {
	case cr < 0:
		return errChunkBareLF
	case cr != len(line)-2:
		return errChunkCR
	}
	line = line[:cr]
	if len(line) >= maxChunkLine {
		return errChunkLineLong
	}
	d.excess += int64(len(line)) + 2 // the line, and the CRLF after the data
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	line, _, _ = bytes.Cut(line, []byte(";")) // extensions are dropped
	if len(line) == 0 {
		return errChunkHex
	}
	var n uint64
	for k, c := range line {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return errChunkHex
		}
		if k == 16 {
			return errChunkLarge
		}
		n = n<<4 | uint64(c)
	}
	// One byte a chunk is allowed; long extensions on small chunks are
	// not: 16 bytes of overhead a chunk plus twice its data, as net/http.
	d.excess = max(d.excess-16-2*int64(n), 0)
	if d.excess > 16<<10 {
		return errChunkExcess
	}
	d.n = n
	if n == 0 {
		d.state = chunkLast
	} else {
		d.state = chunkData
	}
	return nil
}
