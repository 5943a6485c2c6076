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

// Lenient decoding, for the scan of every stream (scan.go) and for the
// streams the library path reads (library.go). It reads what a forgiving
// reader (pdf.js, the reference) could make of a stream: every filter pdf.js
// applies to text (Flate, LZW with /EarlyChange, ASCII85, ASCIIHex,
// RunLength, their abbreviations, any number of steps, PNG and TIFF
// predictors), raw deflate when the zlib header is missing, and whatever a
// damaged stream yields before the damage. Every step's output is charged
// to the budget.

// decodeResult says how far lenientChain got.
type decodeResult int

const (
	decoded   decodeResult = iota // the whole chain was applied
	damaged                       // the chain was applied, but the data broke off: what came before is kept
	undecoded                     // a filter this package cannot apply (Brotli, an unknown name, bad predictor parameters)
	imageData                     // the chain ends in an image codec: not text
)

// variant is one decoding of a stream: its data and how far the decoding
// got. rest is, for a damaged or undecoded variant, the number of bytes the
// failing step could not read (the input of a step that is not applied at
// all, the bytes after the damage): the caller prices them at the worst
// expansion (budget.reserve), never at their size alone.
type variant struct {
	data   []byte
	result decodeResult
	rest   int
}

// inflaters keeps one zlib and one raw deflate reader for a Read, reset for
// each stream: a flate reader is some 40 KB to allocate.
type inflaters struct {
	z, f io.ReadCloser
	src  bytes.Reader
}

// open reads zlib data, or raw deflate data when the zlib header is
// missing or wrong. It returns nil when neither can start. The inflater
// reads c.src byte by byte (a bytes.Reader is an io.ByteReader): what it
// leaves in c.src is what it did not consume.
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

// maxChain bounds the steps of a filter chain (pdf.js has no bound; each
// step is charged to the budget, and a long chain of steps that produce
// nothing is a file no writer makes).
const maxChain = 32

func lenientChain(raw []byte, chain []filter, b *budget, inf *inflaters) (variant, error) {
	data := raw
	result := decoded
	rest := 0
	if len(chain) > maxChain {
		return variant{result: undecoded, rest: len(raw)}, nil
	}
	for _, f := range chain {
		if err := b.check(); err != nil {
			return variant{}, err
		}
		var r io.Reader
		var src *bytes.Reader
		parms, _ := f.parms.(dict)
		switch f.name {
		case "FlateDecode", "Fl":
			r = inf.open(data)
			if r == nil {
				// No data: nothing to decode.
				data = nil
				continue
			}
			src = &inf.src
			pr, ok := predictor(r, parms)
			if !ok {
				return variant{result: undecoded, rest: len(data)}, nil
			}
			r = pr
		case "LZWDecode", "LZW":
			lz := newLZW(data, parms)
			pr, ok := predictor(lz, parms)
			if !ok {
				return variant{result: undecoded, rest: len(data)}, nil
			}
			r = pr
		case "ASCII85Decode", "A85":
			src = bytes.NewReader(data)
			r = ascii85.NewDecoder(&alphaReader{r: src})
		case "ASCIIHexDecode", "AHx":
			r = &hexReader{data: data}
		case "RunLengthDecode", "RL":
			r = &runLengthReader{data: data}
		case "Crypt", "Identity":
			// Decryption is applied before the chain (crypt.go); pdf.js
			// passes these names through.
			continue
		case "DCTDecode", "DCT", "JPXDecode", "JPX", "JBIG2Decode", "CCITTFaxDecode", "CCF":
			return variant{result: imageData, rest: len(data)}, nil
		default:
			// Brotli, or a name this package does not know: it may be a
			// compression another reader applies.
			return variant{result: undecoded, rest: len(data)}, nil
		}
		out, err := readAll(&meter{r, b}, b, 4*len(data))
		if errors.Is(err, errOver) || b.over {
			return variant{}, errOver
		}
		broke := err != io.EOF
		if lr, ok := r.(*lenientReader); ok && lr.broke {
			broke = true
		}
		if pr, ok := r.(*predictReader); ok {
			if lr, ok := pr.r.(*lenientReader); ok && lr.broke {
				broke = true
			}
			broke = broke || pr.bad
		}
		if broke && result == decoded {
			// What came before the damage goes on through the chain.
			result = damaged
			if src != nil {
				rest = src.Len()
			}
		}
		data = out
	}
	return variant{data: data, result: result, rest: rest}, nil
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

// streamChains returns the filter chains a stream's data may be read
// with: first pdf.js's (which takes /F before /Filter and /DP before
// /DecodeParms), then the others those keys allow (the library's and the
// specification's /Filter with /DecodeParms), each once. Without a
// dictionary, or with a filter given by reference (the scan does not
// resolve references), zlib data is inflated.
func streamChains(hdr dict, raw []byte) [][]filter {
	if hdr == nil {
		return [][]filter{guessFilters(raw)}
	}
	var fs, ps []any
	if f, ok := hdr["F"]; ok {
		fs = append(fs, f)
	}
	fs = append(fs, hdr["Filter"])
	if p, ok := hdr["DP"]; ok {
		ps = append(ps, p)
	}
	ps = append(ps, hdr["DecodeParms"])
	if len(fs) == 1 && len(ps) == 1 {
		return [][]filter{chainOf(fs[0], ps[0], raw)}
	}
	var out [][]filter
	seen := map[string]bool{}
	for _, f := range fs {
		for _, p := range ps {
			c := chainOf(f, p, raw)
			k := fmt.Sprint(c)
			if !seen[k] {
				seen[k] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// chainOf reads a filter value and its parameters as pdf.js does: a name,
// or an array of names with an array of parameter dictionaries; any other
// value applies no filter. An array element that is no name makes pdf.js
// fail on the stream: it reads as a filter this package does not know.
func chainOf(f, p any, raw []byte) []filter {
	switch f := f.(type) {
	case pdfName:
		pd, _ := p.(dict)
		return []filter{{name: string(f), parms: pd}}
	case array:
		pa, _ := p.(array)
		chain := make([]filter, 0, len(f))
		for i, e := range f {
			var pd any
			if i < len(pa) {
				if d, ok := pa[i].(dict); ok {
					pd = d
				}
			}
			switch e := e.(type) {
			case pdfName:
				chain = append(chain, filter{name: string(e), parms: pd})
			case objref:
				return guessFilters(raw)
			default:
				chain = append(chain, filter{name: "?"})
			}
		}
		return chain
	case objref:
		return guessFilters(raw)
	}
	return nil
}

func guessFilters(raw []byte) []filter {
	if len(raw) >= 2 && raw[0]&0x0f == 8 && (uint16(raw[0])<<8|uint16(raw[1]))%31 == 0 {
		return []filter{{name: "FlateDecode"}}
	}
	return nil
}
