package pdf

import (
	"bytes"
	"errors"
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
