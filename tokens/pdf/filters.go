package pdf

import (
	"io"
	"math"
)

// The LZW decoder and the predictors of the lenient chain (decode.go),
// written to read what pdf.js reads (src/core/lzw_stream.js and
// predictor_stream.js). Go's compress/lzw is not PDF's LZW: it has no
// /EarlyChange (PDF's default is the "early change" of TIFF), so it would
// misread most PDF LZW data.

// lzwReader decodes PDF LZW data: codes of 9 to 12 bits, most significant
// bit first, 256 clears the table, 257 ends the data. Its memory is fixed
// (a 4096-entry table) and its output is metered by the caller, so a code
// that stands for 4096 bytes costs what it yields.
type lzwReader struct {
	src     []byte
	pos     int
	cache   uint32
	ncache  uint
	early   int
	codeLen uint
	next    int
	prev    int
	vals    [4096]byte
	lens    [4096]uint16
	prevs   [4096]uint16
	seq     [4100]byte
	seqLen  int
	pend    []byte
	done    bool
}

func newLZW(data []byte, parms dict) *lzwReader {
	early := 1
	if e, ok := parms["EarlyChange"]; ok {
		switch e := e.(type) {
		case int64:
			early = int(min(max(e, -1), 1))
		case float64:
			early = int(min(max(e, -1), 1))
		case bool:
			if e {
				early = 1 // pdf.js adds it as a number
			} else {
				early = 0
			}
		default:
			early = 0 // pdf.js: a value that is no number adds nothing
		}
	}
	z := &lzwReader{src: data, early: early, codeLen: 9, next: 258}
	for i := 0; i < 256; i++ {
		z.vals[i] = byte(i)
		z.lens[i] = 1
	}
	return z
}

func (z *lzwReader) bits(n uint) (int, bool) {
	for z.ncache < n {
		if z.pos >= len(z.src) {
			return 0, false
		}
		z.cache = z.cache<<8 | uint32(z.src[z.pos])
		z.pos++
		z.ncache += 8
	}
	z.ncache -= n
	return int(z.cache>>z.ncache) & (1<<n - 1), true
}

func (z *lzwReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(z.pend) > 0 {
			m := copy(p[n:], z.pend)
			n += m
			z.pend = z.pend[m:]
			continue
		}
		if z.done {
			break
		}
		code, ok := z.bits(z.codeLen)
		if !ok || code == 257 {
			z.done = true
			break
		}
		hasPrev := z.seqLen > 0
		switch {
		case code < 256:
			z.seq[0] = byte(code)
			z.seqLen = 1
		case code == 256:
			z.codeLen, z.next, z.seqLen = 9, 258, 0
			continue
		case code < z.next:
			l := int(z.lens[code])
			if l > len(z.seq) {
				l = len(z.seq)
			}
			q := code
			for j := l - 1; j >= 0; j-- {
				z.seq[j] = z.vals[q]
				q = int(z.prevs[q])
			}
			z.seqLen = l
		default:
			// The code being defined (or a bad one): the previous
			// sequence and its first byte.
			if z.seqLen < len(z.seq) {
				z.seq[z.seqLen] = z.seq[0]
				z.seqLen++
			}
		}
		if hasPrev {
			if z.next < len(z.vals) {
				z.prevs[z.next] = uint16(z.prev)
				z.lens[z.next] = uint16(min(int(z.lens[z.prev])+1, len(z.seq)))
				z.vals[z.next] = z.seq[0]
			}
			z.next++
			if k := z.next + z.early; k > 0 && k&(k-1) == 0 {
				z.codeLen = uint(min(int(math.Log2(float64(k)))+1, 12))
			}
		}
		z.prev = code & 4095
		z.pend = z.seq[:z.seqLen]
	}
	if n == 0 && z.done {
		return 0, io.EOF
	}
	return n, nil
}

// maxRowBytes bounds a predictor's row (pdf.js allocates it as given).
const maxRowBytes = 1 << 18

// predictor wraps r in the predictor its parameters name. ok is false for
// parameters this package does not apply (pdf.js rejects a predictor other
// than 2 and 10 to 15 too, and reads such a stream as empty).
func predictor(r io.Reader, parms dict) (io.Reader, bool) {
	if parms == nil {
		return r, true
	}
	num := func(k pdfName, def int64) (int64, bool) {
		switch v := parms[k].(type) {
		case nil:
			return def, true
		case int64:
			if v == 0 {
				return def, true // pdf.js: `|| default`
			}
			return v, true
		case float64:
			if v == 0 {
				return def, true
			}
			if v != math.Trunc(v) || math.Abs(v) > 1<<40 {
				return 0, false
			}
			return int64(v), true
		}
		return def, true
	}
	pred, ok := num("Predictor", 1)
	if !ok {
		return nil, false
	}
	if pred <= 1 {
		return r, true
	}
	if pred != 2 && (pred < 10 || pred > 15) {
		return nil, false
	}
	colors, ok1 := num("Colors", 1)
	bits, ok2 := num("BitsPerComponent", 8)
	if v, ok := parms["BPC"]; ok && v != nil {
		bits, ok2 = num("BPC", 8)
	}
	cols, ok3 := num("Columns", 1)
	if !ok1 || !ok2 || !ok3 || colors < 1 || colors > 256 || bits < 1 || bits > 16 || cols < 1 || cols > maxRowBytes*8 {
		return nil, false
	}
	rowBytes := (cols*colors*bits + 7) >> 3
	if rowBytes > maxRowBytes {
		return nil, false
	}
	return &predictReader{r: r, png: pred >= 10, colors: int(colors), bits: int(bits), cols: int(cols),
		pix: int((colors*bits + 7) >> 3), row: make([]byte, rowBytes), prev: make([]byte, rowBytes),
		raw: make([]byte, rowBytes+1)}, true
}

// predictReader undoes a PNG (per-row filter byte) or TIFF predictor, row
// by row, as pdf.js's PredictorStream does.
type predictReader struct {
	r                       io.Reader
	png                     bool
	colors, bits, cols, pix int
	row, prev, raw          []byte
	pend                    []byte
	err                     error
	bad                     bool // a row named a filter type that does not exist
}

func (p *predictReader) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		if len(p.pend) > 0 {
			m := copy(b[n:], p.pend)
			n += m
			p.pend = p.pend[m:]
			continue
		}
		if p.err != nil {
			break
		}
		p.nextRow()
	}
	if n == 0 && p.err != nil {
		return 0, p.err
	}
	return n, nil
}

func (p *predictReader) nextRow() {
	raw := p.raw[:len(p.row)]
	typ := byte(0)
	if p.png {
		raw = p.raw[:len(p.row)+1]
	}
	k, err := io.ReadFull(p.r, raw)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	if k == 0 || p.png && k < 2 {
		if err == nil {
			err = io.EOF
		}
		p.err = err
		return
	}
	if p.png {
		typ = raw[0]
		raw = raw[1:k]
	} else {
		raw = raw[:k]
	}
	// A short last row is read as far as it goes.
	row := p.row[:len(raw)]
	copy(p.prev, p.row) // the previous row, for PNG
	switch {
	case !p.png:
		p.tiff(row, raw)
	case typ == 0:
		copy(row, raw)
	case typ == 1:
		for i := range row {
			if i < p.pix {
				row[i] = raw[i]
			} else {
				row[i] = row[i-p.pix] + raw[i]
			}
		}
	case typ == 2:
		for i := range row {
			row[i] = p.prev[i] + raw[i]
		}
	case typ == 3:
		for i := range row {
			if i < p.pix {
				row[i] = p.prev[i]>>1 + raw[i]
			} else {
				row[i] = byte((int(p.prev[i])+int(row[i-p.pix]))>>1) + raw[i]
			}
		}
	case typ == 4:
		for i := range row {
			if i < p.pix {
				row[i] = p.prev[i] + raw[i]
				continue
			}
			up, upLeft, left := int(p.prev[i]), int(p.prev[i-p.pix]), int(row[i-p.pix])
			q := left + up - upLeft
			pa, pb, pc := abs(q-left), abs(q-up), abs(q-upLeft)
			switch {
			case pa <= pb && pa <= pc:
				row[i] = byte(left) + raw[i]
			case pb <= pc:
				row[i] = byte(up) + raw[i]
			default:
				row[i] = byte(upLeft) + raw[i]
			}
		}
	default:
		// pdf.js throws: the data ends here.
		p.bad = true
		p.err = io.EOF
		return
	}
	p.pend = row
	if err != nil {
		p.err = err
	}
}

// tiff undoes TIFF predictor 2 on one row.
func (p *predictReader) tiff(row, raw []byte) {
	c := p.colors
	switch p.bits {
	case 8:
		for i := range row {
			if i < c {
				row[i] = raw[i]
			} else {
				row[i] = row[i-c] + raw[i]
			}
		}
	case 16:
		bpp := 2 * c
		for i := 0; i < len(row); i += 2 {
			if i < bpp || i+1 >= len(row) {
				row[i] = raw[i]
				if i+1 < len(row) {
					row[i+1] = raw[i+1]
				}
				continue
			}
			sum := int(raw[i])<<8 + int(raw[i+1]) + int(row[i-bpp])<<8 + int(row[i-bpp+1])
			row[i], row[i+1] = byte(sum>>8), byte(sum)
		}
	default:
		comp := make([]int, c)
		mask := 1<<p.bits - 1
		var inbuf, outbuf, inbits, outbits, j, k int
		for x := 0; x < p.cols; x++ {
			for kk := 0; kk < c; kk++ {
				for inbits < p.bits {
					if j < len(raw) {
						inbuf = (inbuf<<8 | int(raw[j])) & 0xffffff
					} else {
						inbuf = inbuf << 8 & 0xffffff
					}
					j++
					inbits += 8
				}
				comp[kk] = (comp[kk] + inbuf>>(inbits-p.bits)) & mask
				inbits -= p.bits
				outbuf = (outbuf<<p.bits | comp[kk]) & 0xffffff
				outbits += p.bits
				for outbits >= 8 {
					if k < len(row) {
						row[k] = byte(outbuf >> (outbits - 8))
					}
					k++
					outbits -= 8
				}
			}
		}
		if outbits > 0 && outbits < 8 && k < len(row) {
			row[k] = byte(outbuf<<(8-outbits)) + byte(inbuf&(1<<(8-outbits)-1))
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
