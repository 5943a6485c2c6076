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

// Stream decoding. Every byte every filter produces is taken from the
// budget as it is produced, so a bomb stops at MaxDecoded, and a stream is
// decoded at most once: its data is kept while text may need it.

// maxChain bounds the filters of one stream.
const maxChain = 8

type filter struct {
	name  name
	parms dict
}

// decode decodes s (once), sets its state and returns its data: one
// variant per reading of its filters (pdf.js reads /F before /Filter and
// /DP before /DecodeParms; other readers the other way), none when it
// cannot be decoded. keep keeps the data for later calls.
func (r *reader) decode(s *stream, keep bool) [][]byte {
	if s.state != undone {
		return s.data
	}
	s.state = failed
	if r.encrypted && s.dict["Type"] != name("XRef") {
		return nil // encrypted: its data is text
	}
	var out [][]byte
	state := decoded
	for _, chain := range r.chains(s.dict) {
		data, st := r.apply(s.raw, chain)
		if st == image {
			s.state = image
			return nil
		}
		if data != nil {
			out = append(out, data) // a damaged stream's text before the damage counts
		}
		if st == failed {
			state = failed
		}
	}
	s.state = state
	if keep {
		s.data = out
	}
	return out
}

// chains returns the readings of a stream's filters, each once: the
// specification's (/Filter, /DecodeParms), and pdf.js's, which takes /F
// before /Filter and /DP before /DecodeParms.
func (r *reader) chains(d dict) [][]filter {
	out := [][]filter{r.chain(d["Filter"], d["DecodeParms"])}
	f, fok := d["F"]
	p, pok := d["DP"]
	if fok || pok {
		if !fok {
			f = d["Filter"]
		}
		if !pok {
			p = d["DecodeParms"]
		}
		if c := r.chain(f, p); !sameChain(c, out[0]) {
			out = append(out, c)
		}
	}
	return out
}

func sameChain(a, b []filter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].name != b[i].name || fmt.Sprint(a[i].parms) != fmt.Sprint(b[i].parms) {
			return false
		}
	}
	return true
}

// chain reads a filter value (a name or an array of names) and its
// parameters. A value it cannot read is the filter "?", which decodes
// nothing.
func (r *reader) chain(f, p any) []filter {
	switch f := r.resolve(f).(type) {
	case nil:
		return nil
	case name:
		return []filter{{f, r.dict(p)}}
	case array:
		ps, _ := r.resolve(p).(array)
		c := make([]filter, 0, min(len(f), maxChain+1))
		for i, e := range f {
			if i > maxChain {
				break
			}
			n, _ := r.resolve(e).(name)
			if n == "" {
				n = "?"
			}
			var pd dict
			if i < len(ps) {
				pd = r.dict(ps[i])
			}
			c = append(c, filter{n, pd})
		}
		return c
	}
	return []filter{{name: "?"}}
}

// apply runs a chain of filters over raw. It returns decoded and the data,
// failed and the data before the damage (or nil), or image.
func (r *reader) apply(raw []byte, chain []filter) ([]byte, streamState) {
	if len(chain) > maxChain {
		return nil, failed
	}
	data := raw
	for _, f := range chain {
		var out []byte
		ok := true
		switch f.name {
		case "FlateDecode", "Fl":
			out, ok = r.inflate(data)
		case "LZWDecode", "LZW":
			early := int64(1)
			if e, known := r.int(f.parms["EarlyChange"]); known {
				early = e
			}
			out, ok = r.drain(newLZW(data, early == 1), len(data), 12)
		case "ASCII85Decode", "A85":
			out, ok = r.drain(ascii85.NewDecoder(&a85Clean{data: data}), len(data), 8)
		case "ASCIIHexDecode", "AHx":
			end := bytes.IndexByte(data, '>')
			if end < 0 {
				end = len(data)
			}
			out = hexString(data[:end], nil)
			ok = r.b.take(len(out)) && r.b.step(len(data))
		case "RunLengthDecode", "RL":
			out, ok = r.drain(&runLength{data: data}, len(data), 2)
		case "Crypt", "Identity":
			continue
		case "DCTDecode", "DCT", "JPXDecode", "JPX", "JBIG2Decode", "CCITTFaxDecode", "CCF":
			if isImage(f.name, data) {
				return nil, image
			}
			return nil, failed
		default:
			return nil, failed
		}
		if ok && (f.name[0] == 'F' || f.name[0] == 'L') {
			out, ok = r.unpredict(out, f.parms)
		}
		if !ok || r.b.over {
			return out, failed
		}
		data = out
	}
	return data, decoded
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isImage recognises image data: JPEG and JPEG 2000 by their signatures;
// JBIG2 and CCITT data, which have none, by their filter.
func isImage(f name, data []byte) bool {
	switch f {
	case "DCTDecode", "DCT":
		return bytes.HasPrefix(data, []byte{0xff, 0xd8})
	case "JPXDecode", "JPX":
		return bytes.HasPrefix(data, []byte{0xff, 0x4f, 0xff, 0x51}) || bytes.HasPrefix(data, []byte("\x00\x00\x00\x0cjP  "))
	}
	return true
}

// decoderSetup is the steps a decoder's start costs.
const decoderSetup = 1000

// drain reads src to its end, taking every byte from the budget, and
// cost steps every four bytes (what the decoder spends on them). ok is
// false when src broke off (the data before is returned) or the budget is
// spent.
func (r *reader) drain(src io.Reader, hint, cost int) ([]byte, bool) {
	// Starting a decoder costs as much as decoding a few KiB (its state,
	// its first buffer): a file of many tiny streams pays for each.
	if !r.b.step(decoderSetup) {
		return nil, false
	}
	buf := make([]byte, 0, min(max(hint, 512), 1<<20, int(max(r.b.bytes, 0))+512))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, min(cap(buf), int(max(r.b.bytes, 0))+512))...)[:len(buf)]
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if !r.b.take(n) || !r.b.step(n*cost/4) {
			return buf, false
		}
		switch {
		case err == io.EOF:
			return buf, true
		case errors.Is(err, zlib.ErrChecksum):
			return buf, true // some writers get it wrong; the data is whole
		case err != nil:
			return buf, false
		}
	}
}

// inflate reads zlib data, or raw deflate data when the zlib header is
// wrong, as pdf.js does.
func (r *reader) inflate(data []byte) ([]byte, bool) {
	if len(data) == 0 {
		return nil, true
	}
	if zr, err := zlib.NewReader(bytes.NewReader(data)); err == nil {
		return r.drain(zr, 4*len(data), 2)
	}
	return r.drain(flate.NewReader(bytes.NewReader(data)), 4*len(data), 2)
}

// a85Clean feeds ASCII85 data to the decoder without white space, up to
// its "~>".
type a85Clean struct{ data []byte }

func (a *a85Clean) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(a.data) > 0 {
		c := a.data[0]
		a.data = a.data[1:]
		if c == '~' {
			a.data = nil
			break
		}
		if c >= '!' && c <= 'u' || c == 'z' {
			p[n] = c
			n++
		}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

type runLength struct {
	data []byte
	run  int
	b    byte
	lit  int
}

func (r *runLength) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		switch {
		case r.run > 0:
			p[n] = r.b
			r.run--
			n++
		case r.lit > 0 && len(r.data) > 0:
			k := copy(p[n:], r.data[:min(r.lit, len(r.data))])
			r.data, r.lit, n = r.data[k:], r.lit-k, n+k
		case len(r.data) == 0 || r.data[0] == 128:
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		case r.data[0] < 128:
			r.lit, r.data = int(r.data[0])+1, r.data[1:]
		case len(r.data) > 1:
			r.run, r.b, r.data = 257-int(r.data[0]), r.data[1], r.data[2:]
		default:
			r.data = nil
		}
	}
	return n, nil
}

// lzw decodes PDF's LZW: codes of 9 to 12 bits, most significant bit
// first, 256 clears the table, 257 ends the data; with early change (the
// PDF default, which compress/lzw does not do) the code width grows one
// code sooner. Its table is fixed in size; its output is metered by drain.
type lzw struct {
	src        []byte
	pos        int
	acc        uint32
	nacc       uint
	early      int
	width      uint
	next, prev int
	first      [4096]byte
	lens       [4096]uint16
	prevs      [4096]uint16
	seq        [4096]byte
	seqLen     int
	pend       []byte
	done       bool
}

func newLZW(data []byte, early bool) *lzw {
	z := &lzw{src: data, early: boolInt(early), width: 9, next: 258}
	for i := 0; i < 256; i++ {
		z.first[i], z.lens[i] = byte(i), 1
	}
	return z
}

func (z *lzw) code() (int, bool) {
	for z.nacc < z.width {
		if z.pos >= len(z.src) {
			return 0, false
		}
		z.acc = z.acc<<8 | uint32(z.src[z.pos])
		z.pos++
		z.nacc += 8
	}
	z.nacc -= z.width
	return int(z.acc>>z.nacc) & (1<<z.width - 1), true
}

func (z *lzw) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && !z.done {
		if len(z.pend) > 0 {
			k := copy(p[n:], z.pend)
			n, z.pend = n+k, z.pend[k:]
			continue
		}
		c, ok := z.code()
		switch {
		case !ok || c == 257:
			z.done = true
			continue
		case c == 256:
			z.width, z.next, z.seqLen = 9, 258, 0
			continue
		}
		hadPrev := z.seqLen > 0
		if c < z.next {
			// The sequence of c, built back to front.
			l := int(z.lens[c])
			for j, q := l-1, c; j >= 0; j-- {
				z.seq[j] = z.first[q]
				q = int(z.prevs[q])
			}
			z.seqLen = l
		} else if z.seqLen > 0 && z.seqLen < len(z.seq) {
			// The code being defined: the previous sequence and its first byte.
			z.seq[z.seqLen] = z.seq[0]
			z.seqLen++
		}
		if hadPrev && z.next < 4096 {
			z.prevs[z.next], z.first[z.next] = uint16(z.prev), z.seq[0]
			z.lens[z.next] = uint16(min(int(z.lens[z.prev])+1, len(z.seq)))
			z.next++
			if k := z.next + z.early; k == 512 || k == 1024 || k == 2048 {
				z.width++
			}
		}
		z.prev = c & 4095
		z.pend = z.seq[:z.seqLen]
	}
	if n == 0 && z.done {
		return 0, io.EOF
	}
	return n, nil
}

// unpredict undoes a PNG (per-row filter byte) or TIFF (8-bit) predictor.
// Rows are no longer than the data itself.
func (r *reader) unpredict(data []byte, parms dict) ([]byte, bool) {
	pred, _ := r.int(parms["Predictor"])
	if pred <= 1 {
		return data, true
	}
	colors, bpc, cols := r.param(parms, "Colors", 1), r.param(parms, "BitsPerComponent", 8), r.param(parms, "Columns", 1)
	if colors < 1 || colors > 32 || bpc < 1 || bpc > 16 || cols < 1 || cols > int64(len(data))*8+8 {
		return nil, false
	}
	row := int((cols*colors*bpc + 7) / 8)
	pix := int(max((colors*bpc+7)/8, 1))
	if pred == 2 {
		if bpc != 8 {
			return nil, false
		}
		for i := range data {
			if i%row >= pix {
				data[i] += data[i-pix]
			}
		}
		return data, true
	}
	if pred < 10 || pred > 15 {
		return nil, false
	}
	out := make([]byte, 0, len(data))
	prev := make([]byte, min(row, len(data)))
	for len(data) > 1 {
		typ, raw := data[0], data[1:min(len(data), row+1)]
		data = data[len(raw)+1:]
		at := len(out)
		for i, c := range raw {
			var left, up, ul byte
			if i >= pix {
				left, ul = out[at+i-pix], prev[i-pix]
			}
			up = prev[i]
			switch typ {
			case 1:
				c += left
			case 2:
				c += up
			case 3:
				c += byte((int(left) + int(up)) / 2)
			case 4:
				c += paeth(left, up, ul)
			case 0:
			default:
				return out, false
			}
			out = append(out, c)
		}
		copy(prev, out[at:])
	}
	return out, true
}

func (r *reader) param(d dict, k name, def int64) int64 {
	if v, ok := r.int(d[k]); ok && v != 0 {
		return v
	}
	return def
}

func paeth(a, b, c byte) byte {
	p := int(a) + int(b) - int(c)
	pa, pb, pc := abs(p-int(a)), abs(p-int(b)), abs(p-int(c))
	switch {
	case pa <= pb && pa <= pc:
		return a
	case pb <= pc:
		return b
	}
	return c
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
