package pdf

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"strings"
)

// builder writes PDFs by hand for the tests: numbered objects, then a
// classic xref table or an xref stream, with some objects packed in an
// object stream.
type builder struct {
	version string
	objs    [][]byte // objs[i] is the body of object i+1 (without "N 0 obj")
	packed  map[int]bool
	// For encrypted files (crypt_test.go): what encrypts the data of the
	// object stream xrefStream writes, and more entries for its trailer.
	encrypt   func(num int, data []byte) []byte
	xrefExtra string
}

func newBuilder() *builder { return &builder{version: "1.7", packed: map[int]bool{}} }

// add appends an object and returns its number.
func (b *builder) add(body string) int {
	b.objs = append(b.objs, []byte(body))
	return len(b.objs)
}

// reserve appends a placeholder to fill with set.
func (b *builder) reserve() int { return b.add("null") }

func (b *builder) set(n int, body string) { b.objs[n-1] = []byte(body) }

// stream appends a stream object; extra goes into its dictionary.
func (b *builder) stream(extra string, data []byte) int {
	return b.add(streamBody(extra, data))
}

func streamBody(extra string, data []byte) string {
	return fmt.Sprintf("<< /Length %d %s >>\nstream\n%s\nendstream", len(data), extra, data)
}

// flate appends a FlateDecode stream of data.
func (b *builder) flate(extra string, data []byte) int {
	return b.stream("/Filter /FlateDecode "+extra, zlibBytes(data))
}

func zlibBytes(data []byte) []byte {
	var buf bytes.Buffer
	w, _ := zlib.NewWriterLevel(&buf, zlib.BestCompression)
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

// pack marks objects to be stored in an object stream (xrefStream only).
func (b *builder) pack(nums ...int) {
	for _, n := range nums {
		b.packed[n] = true
	}
}

// table writes the file with a classic xref table.
func (b *builder) table(root int, trailerExtra string) []byte {
	var out bytes.Buffer
	fmt.Fprintf(&out, "%%PDF-%s\n%%\xe2\xe3\xcf\xd3\n", b.version)
	offs := make([]int, len(b.objs)+1)
	for i, body := range b.objs {
		offs[i+1] = out.Len()
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", i+1, body)
	}
	xref := out.Len()
	fmt.Fprintf(&out, "xref\n0 %d\n0000000000 65535 f \n", len(b.objs)+1)
	for i := 1; i <= len(b.objs); i++ {
		fmt.Fprintf(&out, "%010d 00000 n \n", offs[i])
	}
	fmt.Fprintf(&out, "trailer\n<< /Size %d /Root %d 0 R %s >>\nstartxref\n%d\n%%%%EOF\n", len(b.objs)+1, root, trailerExtra, xref)
	return out.Bytes()
}

// xrefStream writes the file with an xref stream; packed objects go into
// one Flate object stream.
func (b *builder) xrefStream(root int) []byte {
	var out bytes.Buffer
	fmt.Fprintf(&out, "%%PDF-%s\n%%\xe2\xe3\xcf\xd3\n", b.version)
	n := len(b.objs)
	stmNum, xrefNum := n+1, n+2
	type ent struct{ typ, f2, f3 int }
	ents := make([]ent, n+3)
	ents[0] = ent{0, 0, 65535}
	var hdr, body bytes.Buffer
	idx := 0
	for i, o := range b.objs {
		num := i + 1
		if b.packed[num] {
			fmt.Fprintf(&hdr, "%d %d ", num, body.Len())
			body.Write(o)
			body.WriteByte('\n')
			ents[num] = ent{2, stmNum, idx}
			idx++
			continue
		}
		ents[num] = ent{1, out.Len(), 0}
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", num, o)
	}
	if idx > 0 {
		data := zlibBytes(append(hdr.Bytes(), body.Bytes()...))
		if b.encrypt != nil {
			data = b.encrypt(stmNum, data)
		}
		ents[stmNum] = ent{1, out.Len(), 0}
		fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", stmNum,
			streamBody(fmt.Sprintf("/Type /ObjStm /N %d /First %d /Filter /FlateDecode", idx, hdr.Len()), data))
	}
	xrefOff := out.Len()
	ents[xrefNum] = ent{1, xrefOff, 0}
	var rows bytes.Buffer
	for _, e := range ents {
		rows.Write([]byte{byte(e.typ), byte(e.f2 >> 24), byte(e.f2 >> 16), byte(e.f2 >> 8), byte(e.f2), byte(e.f3 >> 8), byte(e.f3)})
	}
	fmt.Fprintf(&out, "%d 0 obj\n%s\nendobj\n", xrefNum,
		streamBody(fmt.Sprintf("/Type /XRef /Size %d /W [1 4 2] /Root %d 0 R /Filter /FlateDecode %s", len(ents), root, b.xrefExtra), zlibBytes(rows.Bytes())))
	fmt.Fprintf(&out, "startxref\n%d\n%%%%EOF\n", xrefOff)
	return out.Bytes()
}

// doc is a document: a page tree over pages whose content streams are
// given, with one WinAnsi Helvetica font /F1.
type doc struct {
	*builder
	catalog, pages, font int
	kids                 []int
}

func newDoc() *doc {
	d := &doc{builder: newBuilder()}
	d.catalog = d.reserve()
	d.pages = d.reserve()
	d.font = d.add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
	return d
}

// page adds a page whose /Contents is the given content object(s).
func (d *doc) page(contents ...int) int {
	c := fmt.Sprintf("%d 0 R", contents[0])
	if len(contents) > 1 {
		var parts []string
		for _, n := range contents {
			parts = append(parts, fmt.Sprintf("%d 0 R", n))
		}
		c = "[" + strings.Join(parts, " ") + "]"
	}
	p := d.add(fmt.Sprintf("<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %s >>", d.pages, c))
	d.kids = append(d.kids, p)
	return p
}

// textPage adds a page showing content (a content stream), compressed or not.
func (d *doc) textPage(content string, compress bool) int {
	var c int
	if compress {
		c = d.flate("", []byte(content))
	} else {
		c = d.stream("", []byte(content))
	}
	return d.page(c)
}

func (d *doc) finish(resources string) {
	d.set(d.catalog, fmt.Sprintf("<< /Type /Catalog /Pages %d 0 R >>", d.pages))
	var kids []string
	for _, k := range d.kids {
		kids = append(kids, fmt.Sprintf("%d 0 R", k))
	}
	if resources == "" {
		resources = fmt.Sprintf("<< /Font << /F1 %d 0 R >> >>", d.font)
	}
	d.set(d.pages, fmt.Sprintf("<< /Type /Pages /Kids [%s] /Count %d /Resources %s >>", strings.Join(kids, " "), len(d.kids), resources))
}

func (d *doc) bytes() []byte {
	d.finish("")
	return d.table(d.catalog, "")
}

// show is a content stream showing each line with Tj.
func show(lines ...string) string {
	var b strings.Builder
	b.WriteString("BT /F1 12 Tf 72 720 Td 14 TL\n")
	for _, l := range lines {
		fmt.Fprintf(&b, "(%s) Tj T*\n", escape(l))
	}
	b.WriteString("ET\n")
	return b.String()
}

func escape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `(`, `\(`, `)`, `\)`)
	return r.Replace(s)
}

// bitWriter writes a deflate bit stream (LSB first).
type bitWriter struct {
	buf   []byte
	acc   uint64
	nbits uint
}

func (w *bitWriter) bits(v uint64, n uint) {
	w.acc |= v << w.nbits
	w.nbits += n
	for w.nbits >= 8 {
		w.buf = append(w.buf, byte(w.acc))
		w.acc >>= 8
		w.nbits -= 8
	}
}

// code writes a Huffman code of n bits, most significant bit first.
func (w *bitWriter) code(c uint64, n uint) {
	for i := int(n) - 1; i >= 0; i-- {
		w.bits(c>>uint(i)&1, 1)
	}
}

func (w *bitWriter) flush() []byte {
	if w.nbits > 0 {
		w.buf = append(w.buf, byte(w.acc))
	}
	return w.buf
}

// bombZlib returns a zlib stream that inflates to about size zero bytes,
// at 1032:1: one dynamic Huffman block where a 258-byte match costs two
// bits, so that the body is all zero bytes.
func bombZlib(size int64) []byte {
	w := &bitWriter{buf: []byte{0x78, 0x9c}}
	w.bits(1, 1)  // BFINAL
	w.bits(2, 2)  // dynamic Huffman
	w.bits(29, 5) // HLIT: 286 literal/length codes
	w.bits(0, 5)  // HDIST: 1 distance code
	w.bits(14, 4) // HCLEN: 18 code length codes
	// Code length code lengths, in the order 16 17 18 0 8 7 9 6 10 5 11 4
	// 12 3 13 2 14 1: 18 gets 1 bit, 1 and 2 get 2 bits.
	for _, l := range []uint64{0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2} {
		w.bits(l, 3)
	}
	// Codes: 18 → 0, 1 → 10, 2 → 11.
	zeros := func(n int) { // n in 11..138
		w.code(0, 1)
		w.bits(uint64(n-11), 7)
	}
	w.code(3, 2) // literal 0: length 2
	zeros(138)
	zeros(117)   // literals 1..255: unused
	w.code(3, 2) // 256 (end of block): length 2
	zeros(28)    // 257..284: unused
	w.code(2, 2) // 285 (length 258): length 1
	w.code(2, 2) // distance 0 (distance 1): length 1
	// Literal/length codes: 285 → 0, 0 → 10, 256 → 11. Distance 0 → 0.
	w.code(2, 2) // the literal 0
	matches := size / 258
	for matches > 0 && w.nbits != 0 {
		w.code(0, 1)
		w.code(0, 1)
		matches--
	}
	w.buf = append(w.buf, make([]byte, matches/4)...)
	for i := matches % 4; i > 0; i-- {
		w.code(0, 1)
		w.code(0, 1)
	}
	w.code(3, 2) // end of block
	out := w.flush()
	return append(out, 0, 0, 0, 0) // adler32: never reached
}
