package pdf

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"encoding/ascii85"
	"errors"
	"fmt"
	"io"
)

// maxColumns bounds a PNG predictor's /Columns: the library allocates two
// rows of that many bytes before reading anything.
const maxColumns = 1 << 16

// filter is one step of a stream's filter chain: its name and parameters.
type filter struct {
	name  string
	parms any // the /DecodeParms entry for this step (a dict, or nil)
}

var errFilter = errors.New("pdf: unsupported filter")

// libChain decodes raw exactly as the library's Value.Reader does for the
// filters it supports (FlateDecode, with PNG-Up prediction, and
// ASCII85Decode), charging every step's output to b. It returns what the
// library would read and whether its reader would end with a clean io.EOF.
func libChain(raw []byte, chain []filter, b *budget) (out []byte, cleanEOF bool, err error) {
	var r io.Reader = bytes.NewReader(raw)
	for _, f := range chain {
		switch f.name {
		case "FlateDecode":
			zr, err := zlib.NewReader(r)
			if err != nil {
				return nil, false, errFilter
			}
			r = &meter{zr, b}
			parms, _ := f.parms.(dict)
			pred, ok := parms["Predictor"]
			if !ok || pred == nil {
				continue
			}
			if p, ok := pred.(int64); !ok || p != 12 {
				return nil, false, errFilter
			}
			cols, _ := parms["Columns"].(int64)
			if cols < 0 || cols > maxColumns {
				return nil, false, errFilter
			}
			r = &pngUpReader{r: r, hist: make([]byte, 1+cols), tmp: make([]byte, 1+cols)}
		case "ASCII85Decode":
			if _, ok := f.parms.(dict); ok {
				return nil, false, errFilter
			}
			r = &meter{ascii85.NewDecoder(&alphaReader{r: r}), b}
		default:
			return nil, false, errFilter
		}
	}
	out, err = readAll(r, b, 4*len(raw))
	if err == io.EOF {
		return out, true, nil
	}
	if errors.Is(err, errOver) || b.over {
		return out, false, errOver
	}
	return out, false, nil
}

// pngUpReader and alphaReader reproduce the library's readers of the same
// names, so that libChain reads what the library reads.
type pngUpReader struct {
	r    io.Reader
	hist []byte
	tmp  []byte
	pend []byte
}

func (r *pngUpReader) Read(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		if len(r.pend) > 0 {
			m := copy(b, r.pend)
			n += m
			b = b[m:]
			r.pend = r.pend[m:]
			continue
		}
		_, err := io.ReadFull(r.r, r.tmp)
		if err != nil {
			return n, err
		}
		if r.tmp[0] != 2 {
			return n, fmt.Errorf("malformed PNG-Up encoding")
		}
		for i, c := range r.tmp {
			r.hist[i] += c
		}
		r.pend = r.hist[1:]
	}
	return n, nil
}

type alphaReader struct {
	r   io.Reader
	eod bool
}

func (a *alphaReader) Read(p []byte) (int, error) {
	if a.eod {
		return 0, io.EOF
	}
	n, err := a.r.Read(p)
	out := 0
	for i := 0; i < n; i++ {
		c := p[i]
		if c == '~' {
			a.eod = true
			return out, io.EOF
		}
		if (c >= '!' && c <= 'u') || c == 'z' {
			p[out] = c
			out++
		}
	}
	return out, err
}

// Lenient decoding, for the scan of every stream (scan.go). It reads what a
// forgiving reader could make of a stream: more filters than the library,
// raw deflate when the zlib header is missing, and whatever a damaged stream
// yields before the damage. Every step's output is charged to the budget.

// decodeResult says how far lenientChain got.
type decodeResult int

const (
	decoded   decodeResult = iota // the whole chain was applied
	damaged                       // the chain was applied, but the data broke off: what came before is kept
	undecoded                     // a filter this package cannot apply (LZW, encryption, …)
	imageData                     // the chain ends in an image codec: not text
)

// inflaters keeps one zlib and one raw deflate reader for a Read, reset for
// each stream: a flate reader is some 40 KB to allocate.
type inflaters struct {
	z, f io.ReadCloser
	src  bytes.Reader
}

// open reads zlib data, or raw deflate data when the zlib header is
// missing or wrong. It returns nil when neither can start.
func (c *inflaters) open(data []byte) io.Reader {
	c.src.Reset(data)
	if len(data) >= 2 && data[0]&0x0f == 8 && (uint16(data[0])<<8|uint16(data[1]))%31 == 0 {
		var err error
		if c.z == nil {
			c.z, err = zlib.NewReader(&c.src)
		} else {
			err = c.z.(zlib.Resetter).Reset(&c.src, nil)
		}
		if err == nil {
			return &lenientReader{r: c.z}
		}
		c.src.Reset(data)
	}
	if len(data) == 0 {
		return nil
	}
	if c.f == nil {
		c.f = flate.NewReader(&c.src)
	} else {
		c.f.(flate.Resetter).Reset(&c.src, nil)
	}
	return &lenientReader{r: c.f}
}

func lenientChain(raw []byte, chain []filter, b *budget, inf *inflaters) ([]byte, decodeResult, error) {
	data := raw
	result := decoded
	for _, f := range chain {
		var r io.Reader
		switch f.name {
		case "FlateDecode", "Fl":
			r = inf.open(data)
			if r == nil {
				return nil, undecoded, nil
			}
		case "ASCII85Decode", "A85":
			r = ascii85.NewDecoder(&alphaReader{r: bytes.NewReader(data)})
		case "ASCIIHexDecode", "AHx":
			r = &hexReader{data: data}
		case "RunLengthDecode", "RL":
			r = &runLengthReader{data: data}
		case "Crypt", "Identity":
			continue
		case "DCTDecode", "DCT", "JPXDecode", "JBIG2Decode", "CCITTFaxDecode", "CCF":
			return nil, imageData, nil
		default:
			return nil, undecoded, nil
		}
		out, err := readAll(&meter{r, b}, b, 4*len(data))
		if errors.Is(err, errOver) || b.over {
			return nil, decoded, errOver
		}
		if lr, ok := r.(*lenientReader); ok && lr.broke || err != io.EOF {
			result = damaged
		}
		data = out
	}
	return data, result, nil
}

// lenientReader turns a decoder's error into the end of its data: what was
// decoded before the damage is kept.
type lenientReader struct {
	r     io.Reader
	broke bool // the data broke off
}

func (l *lenientReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if err != nil && err != io.EOF && !errors.Is(err, errOver) {
		// A wrong checksum after whole data is no damage: some writers
		// get it wrong.
		l.broke = l.broke || err != zlib.ErrChecksum
		err = io.EOF
	}
	return n, err
}

type hexReader struct {
	data []byte
	hi   int // pending high nibble plus one, or 0
	done bool
}

func (h *hexReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(h.data) > 0 && !h.done {
		c := h.data[0]
		h.data = h.data[1:]
		if c == '>' {
			h.done = true
			break
		}
		v := unhex(c)
		if v < 0 {
			continue
		}
		if h.hi == 0 {
			h.hi = v + 1
			continue
		}
		p[n] = byte((h.hi-1)<<4 | v)
		h.hi = 0
		n++
	}
	if n == 0 && (len(h.data) == 0 || h.done) {
		if h.hi != 0 {
			p[0] = byte((h.hi - 1) << 4)
			h.hi = 0
			return 1, io.EOF
		}
		return 0, io.EOF
	}
	return n, nil
}

type runLengthReader struct {
	data []byte
	run  int
	lit  int
	b    byte
}

func (r *runLengthReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		switch {
		case r.run > 0:
			p[n] = r.b
			r.run--
			n++
		case r.lit > 0:
			if len(r.data) == 0 {
				r.lit = 0
				continue
			}
			p[n] = r.data[0]
			r.data = r.data[1:]
			r.lit--
			n++
		default:
			if len(r.data) == 0 || r.data[0] == 128 {
				if n == 0 {
					return 0, io.EOF
				}
				return n, nil
			}
			c := int(r.data[0])
			r.data = r.data[1:]
			if c < 128 {
				r.lit = c + 1
			} else if len(r.data) > 0 {
				r.run = 257 - c
				r.b = r.data[0]
				r.data = r.data[1:]
			}
		}
	}
	return n, nil
}
