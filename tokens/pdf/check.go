package pdf

import (
	"bytes"
	"errors"
	"strconv"
)

// The structure check. Before the library opens a file, check replays what
// the library will do with the file's cross-reference data and object
// streams (github.com/ledongthuc/pdf read.go: NewReaderEncrypted, readXref*,
// resolve), using the mirror lexer of lex.go, and refuses the library any
// file on which it would:
//
//   - allocate by an attacker's number: an xref /Size, a subsection start,
//     a /W width, a predictor's /Columns (an out-of-memory crash is fatal in
//     Go, recover cannot catch it);
//   - loop without reading the file: an xref stream whose rows have no
//     bytes (/W [0 0 0]), an object stream whose /N promises more objects
//     than its data holds, a hex string left open at the end of an object
//     stream (the library's lexer spins on it);
//   - recurse without bound: an object stream stored in an object stream,
//     an object stream whose /N, /Filter, … is itself stored in an object
//     stream (the stack overflow is fatal too);
//   - parse an object of more than maxObjectTokens tokens (it builds every
//     value in memory, at 16 to 40 bytes a token);
//   - follow a /Prev chain in a cycle;
//   - decrypt (encrypted files go to the scan, which decrypts them when
//     the empty password opens them, crypt.go, and costs them by size
//     otherwise);
//   - read other objects than other readers would: a hybrid file (the
//     library ignores /XRefStm), an object stream listing an object twice
//     (the library takes the first, other readers the one the xref names).
//
// check also decodes the xref streams and object streams the library will
// decode itself, with the same filters, under the budget: those are the
// only decoding the library does on its own; every other stream is decoded
// on this package's request (library.go), where the filters are checked
// first and the output is metered.

// maxObjects bounds the object numbers of a file handed to the library; its
// xref table costs 40 bytes an object. A file may also not have more
// objects than a quarter of its size (plus some): real files spend far more
// than four bytes an object.
const maxObjects = 1 << 19

var (
	// errNoLibrary: the library must not read this file; the scan costs it.
	errNoLibrary = errors.New("pdf: not for the library")
	// errEncrypted: the file is encrypted; the scan reads it (crypt.go).
	errEncrypted = errors.New("pdf: encrypted")
)

// xentry mirrors the library's xref entry.
type xentry struct {
	ptr      objref
	inStream bool
	stream   objref
	offset   int64
}

// rawEntry is one row of a cross-reference section, in the order the
// library reads them (newest section first).
type rawEntry struct {
	x    int
	kind int64 // table: 'n' or 'f'; stream: the type field
	a, b int64 // table: offset, generation; stream: fields 2 and 3
}

type checker struct {
	view  []byte // the file as the library sees it (data[:end])
	limit int    // the most objects (xref rows and object numbers) allowed
	b     *budget
	ents  []rawEntry
	work  int // bytes the check's lexers may still read
	objs  map[int64]objdef
}

// checkStructure returns nil when the library may open view, errNoLibrary
// or errEncrypted when it must not, and errOver when the budget ran out.
func checkStructure(view []byte, b *budget) error {
	err := newChecker(view, b).run()
	if errors.Is(err, errSyntax) {
		// The library would fail to open the file: the scan reads it.
		return errNoLibrary
	}
	return err
}

func newChecker(view []byte, b *budget) *checker {
	// The check reads each part of the file a few times at most; a file
	// that makes it read more is not for the library.
	return &checker{view: view, b: b, work: 16*len(view) + 1<<16, objs: map[int64]objdef{},
		limit: min(maxObjects, len(view)/4+1024)}
}

func (c *checker) run() error {
	startxref, err := libStartxref(c.view)
	if err != nil {
		return err
	}
	lx, err := c.lexerAt(startxref)
	if err != nil {
		return err
	}
	tok, err := parse(lx.readToken)
	if err != nil {
		return err
	}
	var table []xentry
	var trailer dict
	switch tok.(type) {
	case keyword:
		if tok != keyword("xref") {
			return errSyntax
		}
		table, trailer, err = c.readTable(lx, startxref)
	case int64:
		lx.unreadToken(tok)
		table, trailer, err = c.readXrefStreams(lx)
	default:
		return errSyntax
	}
	if err != nil {
		return err
	}
	if trailer["Encrypt"] != nil {
		return errEncrypted
	}
	if trailer["XRefStm"] != nil {
		// A hybrid file: the library ignores the xref stream that lists
		// the objects of its object streams, and would read them as null.
		return errNoLibrary
	}
	if err := c.checkObjectSizes(table); err != nil {
		return err
	}
	return c.checkObjectStreams(table)
}

// maxObjectTokens bounds the tokens of one object the library may parse:
// it builds every value of an object in memory, at some 16 to 40 bytes a
// token (a 10 MB array would take hundreds of megabytes). Real objects have
// far fewer (a large font's widths, a page tree node of thousands of pages).
const maxObjectTokens = 1 << 18

// checkObjectSizes refuses a file one of whose objects is too large for
// the library to parse (stream data is not parsed, and does not count).
func (c *checker) checkObjectSizes(table []xentry) error {
	seen := map[int64]bool{}
	for _, e := range table {
		if e.inStream || e.offset <= 0 || e.offset >= int64(len(c.view)) || seen[e.offset] {
			continue
		}
		seen[e.offset] = true
		if err := c.b.tick(); err != nil {
			return err
		}
		n, read := skimObject(c.view, int(e.offset), 3)
		if c.work -= read; c.work < 0 {
			return errNoLibrary
		}
		if n > maxObjectTokens {
			return errNoLibrary
		}
	}
	return nil
}

// skimObject counts the tokens of the object at data[i:] (after skip
// tokens, the "N G obj" of an indirect object), without building it, and
// stops past maxObjectTokens. It returns the count and the bytes it read.
func skimObject(data []byte, i, skip int) (tokens, read int) {
	start := i
	depth := 0
	for tokens <= maxObjectTokens+skip {
		i = skipSpace(data, i)
		if i >= len(data) {
			break
		}
		switch c := data[i]; {
		case c == '(':
			i = skipLiteral(data, i+1)
		case c == '<' && i+1 < len(data) && data[i+1] == '<':
			depth++
			i += 2
		case c == '>' && i+1 < len(data) && data[i+1] == '>':
			depth--
			i += 2
		case c == '<':
			if k := bytes.IndexByte(data[i:], '>'); k >= 0 {
				i += k + 1
			} else {
				i = len(data)
			}
		case c == '[' || c == '{':
			depth++
			i++
		case c == ']' || c == '}':
			depth--
			i++
		default:
			j := i + 1
			for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
				j++
			}
			i = j
		}
		tokens++
		if tokens > skip && depth <= 0 {
			break
		}
	}
	return tokens - skip, i - start
}

// skipLiteral returns the index after the literal string whose '(' is
// before i.
func skipLiteral(data []byte, i int) int {
	depth := 1
	for i < len(data) {
		switch data[i] {
		case '\\':
			i++
		case '(':
			depth++
		case ')':
			if depth--; depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return i
}

func (c *checker) lexerAt(off int64) (*lexer, error) {
	if off < 0 || off > int64(len(c.view)) {
		return nil, errSyntax
	}
	if err := c.b.check(); err != nil {
		return nil, err
	}
	lx := newLexer(c.view, int(off))
	lx.work = &c.work
	return lx, nil
}

// objectAt parses the indirect object at off, once.
func (c *checker) objectAt(off int64) (objdef, error) {
	if d, ok := c.objs[off]; ok {
		return d, nil
	}
	lx, err := c.lexerAt(off)
	if err != nil {
		return objdef{}, err
	}
	d, err := parse(func() objdef {
		d, ok := lx.readObject().(objdef)
		if !ok {
			lx.fail()
		}
		return d
	})
	if err != nil {
		return objdef{}, err
	}
	c.objs[off] = d
	return d, nil
}

// libStartxref finds the startxref offset as NewReaderEncrypted does.
func libStartxref(view []byte) (int64, error) {
	const endChunk = 100
	end := len(view)
	if end < endChunk {
		return 0, errSyntax
	}
	buf := view[end-endChunk:]
	for {
		if len(buf) > 0 && buf[len(buf)-1] == '\n' {
			buf = buf[:len(buf)-1]
			continue
		}
		if len(buf) == 0 {
			return 0, errSyntax // the library indexes buf[-1] and panics
		}
		if buf[len(buf)-1] == '\r' {
			buf = buf[:len(buf)-1]
			continue
		}
		break
	}
	buf = bytes.TrimRight(buf, "\r\n\t ")
	if !bytes.HasSuffix(buf, []byte("%%EOF")) {
		return 0, errSyntax
	}
	i := findLastLine(buf, "startxref")
	if i < 0 {
		return 0, errSyntax
	}
	lx := newLexer(view, end-endChunk+i)
	return parse(func() int64 {
		if lx.readToken() != keyword("startxref") {
			lx.fail()
		}
		n, ok := lx.readToken().(int64)
		if !ok {
			lx.fail()
		}
		return n
	})
}

func findLastLine(buf []byte, s string) int {
	bs := []byte(s)
	max := len(buf)
	for {
		i := bytes.LastIndex(buf[:max], bs)
		if i <= 0 || i+len(bs) >= len(buf) {
			return -1
		}
		if (buf[i-1] == '\n' || buf[i-1] == '\r') && (buf[i+len(bs)] == '\n' || buf[i+len(bs)] == '\r') {
			return i
		}
		max = i
	}
}

// maxSections bounds a /Prev chain; the library follows a cycle for ever.
const maxSections = 1024

func (c *checker) readTable(lx *lexer, startxref int64) ([]xentry, dict, error) {
	if err := c.readTableData(lx); err != nil {
		return nil, nil, err
	}
	trailer, err := parse(func() dict {
		d, ok := lx.readObject().(dict)
		if !ok {
			lx.fail()
		}
		return d
	})
	if err != nil {
		return nil, nil, err
	}
	seen := map[int64]bool{startxref: true}
	for prev := trailer["Prev"]; prev != nil; {
		off, ok := prev.(int64)
		if !ok {
			return nil, nil, errSyntax
		}
		if seen[off] || len(seen) > maxSections {
			return nil, nil, errNoLibrary
		}
		seen[off] = true
		plx, err := c.lexerAt(off)
		if err != nil {
			return nil, nil, err
		}
		if tok, err := parse(plx.readToken); err != nil || tok != keyword("xref") {
			return nil, nil, errSyntax
		}
		if err := c.readTableData(plx); err != nil {
			return nil, nil, err
		}
		pt, err := parse(func() dict {
			d, ok := plx.readObject().(dict)
			if !ok {
				plx.fail()
			}
			return d
		})
		if err != nil {
			return nil, nil, err
		}
		prev = pt["Prev"]
	}
	size, ok := trailer["Size"].(int64)
	if !ok {
		return nil, nil, errSyntax
	}
	maxX, err := c.maxIndex()
	if err != nil {
		return nil, nil, err
	}
	table := make([]xentry, maxX+1)
	for _, e := range c.ents {
		if e.kind == 'n' && table[e.x].offset == 0 {
			table[e.x] = xentry{ptr: objref{uint32(e.x), uint16(e.b)}, offset: e.a}
		}
	}
	if size < int64(len(table)) {
		if size < 0 {
			return nil, nil, errSyntax
		}
		table = table[:size]
	}
	return table, trailer, nil
}

// readTableData mirrors the library's readXrefTableData.
func (c *checker) readTableData(lx *lexer) error {
	_, err := parse(func() struct{} {
		for {
			if c.b.tick() != nil {
				return struct{}{}
			}
			tok := lx.readToken()
			if tok == keyword("trailer") {
				return struct{}{}
			}
			start, ok1 := tok.(int64)
			n, ok2 := lx.readToken().(int64)
			if !ok1 || !ok2 {
				lx.fail()
			}
			for i := 0; i < int(n); i++ {
				off, ok1 := lx.readToken().(int64)
				gen, ok2 := lx.readToken().(int64)
				alloc, ok3 := lx.readToken().(keyword)
				if !ok1 || !ok2 || !ok3 || alloc != "f" && alloc != "n" {
					lx.fail()
				}
				if len(c.ents) >= 2*c.limit {
					panic(lexFail{})
				}
				c.ents = append(c.ents, rawEntry{x: int(start) + i, kind: int64(alloc[0]), a: off, b: gen})
			}
		}
	})
	if err != nil && len(c.ents) >= 2*c.limit {
		return errNoLibrary
	}
	if err == nil {
		err = c.b.check()
	}
	return err
}

// maxIndex returns the highest object number the sections name, refusing
// numbers that would make the library allocate far more entries than the
// file has.
func (c *checker) maxIndex() (int, error) {
	bound := min(2*len(c.ents)+1024, c.limit)
	maxX := -1
	for _, e := range c.ents {
		if e.x < 0 {
			return 0, errSyntax // the library indexes table[-n] and panics
		}
		if e.x >= bound {
			return 0, errNoLibrary
		}
		if e.x > maxX {
			maxX = e.x
		}
	}
	return maxX, nil
}

func (c *checker) readXrefStreams(lx *lexer) ([]xentry, dict, error) {
	strm, err := parse(func() streamObj {
		def, ok := lx.readObject().(objdef)
		if !ok {
			lx.fail()
		}
		s, ok := def.obj.(streamObj)
		if !ok {
			lx.fail()
		}
		return s
	})
	if err != nil {
		return nil, nil, err
	}
	if strm.hdr["Type"] != pdfName("XRef") {
		return nil, nil, errSyntax
	}
	size, ok := strm.hdr["Size"].(int64)
	if !ok {
		return nil, nil, errSyntax
	}
	if size > int64(c.limit) {
		return nil, nil, errNoLibrary // the library allocates /Size entries first
	}
	if err := c.readStreamData(strm, size); err != nil {
		return nil, nil, err
	}
	seen := map[int64]bool{}
	for prev := strm.hdr["Prev"]; prev != nil; {
		off, ok := prev.(int64)
		if !ok {
			return nil, nil, errSyntax
		}
		if seen[off] || len(seen) > maxSections {
			return nil, nil, errNoLibrary
		}
		seen[off] = true
		plx, err := c.lexerAt(off)
		if err != nil {
			return nil, nil, err
		}
		ps, err := parse(func() streamObj {
			def, ok := plx.readObject().(objdef)
			if !ok {
				plx.fail()
			}
			s, ok := def.obj.(streamObj)
			if !ok {
				plx.fail()
			}
			return s
		})
		if err != nil {
			return nil, nil, err
		}
		// The library reads these through Value.Key while its xref is still
		// empty: an indirect value reads as null.
		if derefNull(ps.hdr["Type"]) != pdfName("XRef") {
			return nil, nil, errSyntax
		}
		psize, _ := derefNull(ps.hdr["Size"]).(int64)
		if psize > size {
			return nil, nil, errSyntax
		}
		if err := c.readStreamData(ps, psize); err != nil {
			return nil, nil, err
		}
		prev = ps.hdr["Prev"]
	}
	maxX, err := c.maxIndex()
	if err != nil {
		return nil, nil, err
	}
	if size < 0 {
		return nil, nil, errSyntax
	}
	bound := min(2*len(c.ents)+1024, c.limit)
	if size > int64(bound) {
		return nil, nil, errNoLibrary
	}
	n := int(size)
	if maxX+1 > n {
		n = maxX + 1
	}
	table := make([]xentry, n)
	for _, e := range c.ents {
		if table[e.x].ptr != (objref{}) {
			continue
		}
		switch e.kind {
		case 0:
			table[e.x] = xentry{ptr: objref{0, 65535}}
		case 1:
			table[e.x] = xentry{ptr: objref{uint32(e.x), uint16(e.b)}, offset: e.a}
		case 2:
			table[e.x] = xentry{ptr: objref{uint32(e.x), 0}, inStream: true, stream: objref{uint32(e.a), 0}, offset: e.b}
		}
	}
	return table, strm.hdr, nil
}

// derefNull is what Value.Key returns for a value while the library has no
// xref yet: an indirect reference reads as null.
func derefNull(v any) any {
	if _, ok := v.(objref); ok {
		return nil
	}
	return v
}

// readStreamData mirrors the library's readXrefStreamData.
func (c *checker) readStreamData(strm streamObj, size int64) error {
	index, _ := strm.hdr["Index"].(array)
	if index == nil {
		index = array{int64(0), size}
	}
	if len(index)%2 != 0 {
		return errSyntax
	}
	ww, ok := strm.hdr["W"].(array)
	if !ok {
		return errSyntax
	}
	var w []int
	wtotal := 0
	for _, x := range ww {
		i, ok := x.(int64)
		if !ok || int64(int(i)) != i {
			return errSyntax
		}
		if i < 0 {
			return errSyntax // the library slices buf[:negative] and panics
		}
		if i > 16 || len(w) >= 16 {
			return errNoLibrary
		}
		w = append(w, int(i))
		wtotal += int(i)
	}
	if len(w) < 3 {
		return errSyntax
	}
	if wtotal == 0 {
		return errNoLibrary // rows of no bytes: the library never reaches the end
	}
	chain, err := libFilters(strm.hdr, derefNull)
	if err != nil {
		return err
	}
	data, err := c.streamData(strm, derefNull(strm.hdr["Length"]), chain)
	if err != nil {
		return err
	}
	for len(index) > 0 {
		start, ok1 := index[0].(int64)
		n, ok2 := index[1].(int64)
		if !ok1 || !ok2 {
			return errSyntax
		}
		index = index[2:]
		for i := 0; i < int(n); i++ {
			if len(data) < wtotal {
				return errSyntax
			}
			row := data[:wtotal]
			data = data[wtotal:]
			v1 := decodeInt(row[0:w[0]])
			if w[0] == 0 {
				v1 = 1
			}
			v2 := decodeInt(row[w[0] : w[0]+w[1]])
			v3 := decodeInt(row[w[0]+w[1] : w[0]+w[1]+w[2]])
			if len(c.ents) >= 2*c.limit {
				return errNoLibrary
			}
			c.ents = append(c.ents, rawEntry{x: int(start) + i, kind: int64(v1), a: int64(v2), b: int64(v3)})
		}
	}
	return nil
}

func decodeInt(b []byte) int {
	x := 0
	for _, c := range b {
		x = x<<8 | int(c)
	}
	return x
}

// libFilters reads a stream dictionary's filter chain as Value.Reader does;
// deref maps each value as Value.Key would resolve it.
func libFilters(hdr dict, deref func(any) any) ([]filter, error) {
	parms := deref(hdr["DecodeParms"])
	switch f := deref(hdr["Filter"]).(type) {
	case nil:
		return nil, nil
	case pdfName:
		return []filter{{string(f), derefDict(parms, deref)}}, nil
	case array:
		chain := make([]filter, 0, len(f))
		pa, _ := parms.(array)
		for i, e := range f {
			n, ok := deref(e).(pdfName)
			if !ok {
				return nil, errSyntax // applyFilter("") panics
			}
			var p any
			if i < len(pa) {
				p = derefDict(deref(pa[i]), deref)
			}
			chain = append(chain, filter{string(n), p})
		}
		return chain, nil
	default:
		return nil, errSyntax
	}
}

// derefDict applies deref to a parameter dictionary's values.
func derefDict(v any, deref func(any) any) any {
	d, ok := v.(dict)
	if !ok {
		return v
	}
	out := make(dict, len(d))
	for k, x := range d {
		out[k] = deref(x)
	}
	return out
}

// streamData returns what the library reads from strm with the given
// /Length value, under the budget.
func (c *checker) streamData(strm streamObj, length any, chain []filter) ([]byte, error) {
	data, _, err := c.streamDataEOF(strm, length, chain)
	return data, err
}

func (c *checker) streamDataEOF(strm streamObj, length any, chain []filter) ([]byte, bool, error) {
	n, _ := length.(int64)
	if n == 0 {
		return nil, true, nil // the library skips the filters of an empty stream
	}
	raw := []byte{}
	if n > 0 {
		end := strm.offset + n
		if end > int64(len(c.view)) || end < 0 {
			end = int64(len(c.view))
		}
		raw = c.view[strm.offset:end]
	}
	for _, f := range chain {
		if p, ok := f.parms.(dict); ok {
			if cols, ok := p["Columns"].(int64); ok && cols > maxColumns && p["Predictor"] != nil {
				return nil, false, errNoLibrary
			}
		}
	}
	out, clean, err := libChain(raw, chain, c.b)
	if errors.Is(err, errOver) {
		return nil, false, errOver
	}
	if err != nil {
		return nil, false, errSyntax
	}
	return out, clean, nil
}

// checkObjectStreams checks every object stream an xref entry points into.
func (c *checker) checkObjectStreams(table []xentry) error {
	checked := map[uint32]bool{}
	for _, e := range table {
		if !e.inStream || checked[e.stream.id] {
			continue
		}
		checked[e.stream.id] = true
		if err := c.checkObjectStream(table, e.stream.id); err != nil {
			return err
		}
	}
	return nil
}

func (c *checker) checkObjectStream(table []xentry, id uint32) error {
	if int(id) >= len(table) {
		return nil // resolves to null: the library panics, harmlessly
	}
	xs := table[id]
	if xs.ptr != (objref{id, 0}) {
		return nil
	}
	if xs.inStream {
		return errNoLibrary // an object stream inside an object stream: unbounded recursion
	}
	if xs.offset == 0 {
		return nil
	}
	def, err := c.objectAt(xs.offset)
	if errors.Is(err, errOver) {
		return err
	}
	if err != nil || def.ref != (objref{id, 0}) {
		return nil
	}
	strm, ok := def.obj.(streamObj)
	if !ok {
		return nil
	}
	for _, k := range []pdfName{"Type", "N", "First", "Filter", "DecodeParms"} {
		if hasRef(strm.hdr[k], 0) {
			return errNoLibrary
		}
	}
	if strm.hdr["Extends"] != nil {
		return errNoLibrary
	}
	length := strm.hdr["Length"]
	if r, ok := length.(objref); ok {
		length = nil
		if int(r.id) < len(table) && table[r.id].ptr == r {
			t := table[r.id]
			if t.inStream {
				return errNoLibrary
			}
			if t.offset != 0 {
				d, err := c.objectAt(t.offset)
				if errors.Is(err, errOver) {
					return err
				}
				if err != nil || d.ref != r {
					return nil
				}
				length = d.obj
			}
		}
	}
	chain, err := libFilters(strm.hdr, func(v any) any { return v })
	if err != nil {
		return nil
	}
	data, clean, err := c.streamDataEOF(strm, length, chain)
	if errors.Is(err, errOver) || errors.Is(err, errNoLibrary) {
		return err
	}
	if err != nil {
		return nil
	}
	if n, _ := strm.hdr["N"].(int64); n > int64(len(data)/4+1) {
		return errNoLibrary
	}
	if clean && lastHexOpen(data) {
		return errNoLibrary
	}
	first, _ := strm.hdr["First"].(int64)
	if !objectStreamSane(data, strm.hdr["N"], first) {
		return errNoLibrary
	}
	return nil
}

// objectStreamSane reads an object stream's index: it must not list an
// object twice (the library takes the first; other readers take the one
// the xref names, which may be the other, and could then read a page the
// library does not), and no object in it may be too large to parse.
func objectStreamSane(data []byte, n any, first int64) bool {
	count, _ := n.(int64)
	seen := map[int64]bool{}
	i := 0
	for k := int64(0); k < count; k++ {
		var tok [2][]byte
		for t := range tok {
			i = skipSpace(data, i)
			j := i
			for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
				j++
			}
			tok[t], i = data[i:j], j
		}
		if len(tok[0]) == 0 {
			return true
		}
		id, err1 := strconv.ParseInt(string(tok[0]), 10, 64)
		off, err2 := strconv.ParseInt(string(tok[1]), 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if seen[id] {
			return false
		}
		seen[id] = true
		if at := first + off; at >= 0 && at < int64(len(data)) {
			if tokens, _ := skimObject(data, int(at), 0); tokens > maxObjectTokens {
				return false
			}
		}
	}
	return true
}

// hasRef reports whether v holds an indirect reference.
func hasRef(v any, depth int) bool {
	if depth > 8 {
		return true
	}
	switch v := v.(type) {
	case objref:
		return true
	case array:
		for _, e := range v {
			if hasRef(e, depth+1) {
				return true
			}
		}
	case dict:
		for _, e := range v {
			if hasRef(e, depth+1) {
				return true
			}
		}
	}
	return false
}

// lastHexOpen reports whether a hex string could be open at the end of data:
// the library's lexer, reading an object stream, loops for ever on one.
func lastHexOpen(data []byte) bool {
	for i := len(data) - 1; i >= 0; i-- {
		c := data[i]
		if isSpace(c) || unhex(c) >= 0 {
			continue
		}
		return c == '<'
	}
	return false
}
