package pdf

import (
	"bytes"
	"slices"
	"unicode/utf8"
)

// The text of the pages: every /Type /Page object of the file is a page
// (no page tree is trusted to list them all), in file order; the first
// MaxPages have their content streams interpreted for the strings that
// Tj, TJ, ' and " show, decoded through the fonts the page selects with
// Tf. Form XObjects (Do) are interpreted once each and their text kept, so
// a form shown a thousand times costs its text a thousand times and its
// interpretation once.

// textOut buffers text for the sink and hands it over in pieces; without a
// sink it keeps the text (a form's).
type textOut struct {
	buf  []byte
	sink func([]byte) error
	err  error   // the sink's error, once it returned one
	sep  byte    // a separator owed before the next text
	some bool    // some text was written
	keep *budget // without a sink: what the kept text is taken from
	rawN int64   // bytes handed over as they are (for the tests)
}

const outChunk = 4096

func (o *textOut) flush() error {
	if o.err != nil || o.sink == nil || len(o.buf) == 0 {
		return o.err
	}
	if err := o.sink(o.buf); err != nil {
		o.err = err
		return err
	}
	o.buf = o.buf[:0]
	return nil
}

// text appends text, after any separator owed.
func (o *textOut) text(p []byte) error {
	if len(p) == 0 {
		return o.err
	}
	if o.sep != 0 {
		o.buf = append(o.buf, o.sep)
		o.sep = 0
	}
	if o.keep != nil && !o.keep.take(len(p)) {
		return errBound
	}
	o.buf = append(o.buf, p...)
	o.some = true
	if len(o.buf) >= outChunk {
		return o.flush()
	}
	return o.err
}

// raw hands p to the sink as it is, in pieces.
func (o *textOut) raw(p []byte) error {
	o.rawN += int64(len(p))
	for len(p) > 0 && o.err == nil {
		n := min(len(p), 64<<10)
		o.text(p[:n])
		p = p[n:]
	}
	return o.err
}

// separate owes a separator (space or line break) before the next text.
func (o *textOut) separate(c byte) {
	if o.some && o.sep != '\n' {
		o.sep = c
	}
}

// readPages counts the pages and reads the text of the first maxPages.
func (r *reader) readPages() (int, error) {
	type page struct {
		o *object
		d dict
	}
	var pages []page
	for _, o := range r.objs {
		if d, ok := o.val.(dict); ok && d["Type"] == name("Page") {
			pages = append(pages, page{o, d})
		}
	}
	slices.SortFunc(pages, func(a, b page) int {
		if a.o.pos != b.o.pos {
			return a.o.pos - b.o.pos
		}
		return a.o.idx - b.o.idx
	})
	for i, p := range pages {
		if i >= r.maxPages {
			break
		}
		if err := r.page(p.d); err != nil {
			return 0, err
		}
	}
	return len(pages), nil
}

// maxParents bounds the walk up the page tree for inherited resources.
const maxParents = 32

func (r *reader) page(d dict) error {
	var res dict
	for n, p := 0, d; p != nil && n < maxParents && res == nil; n++ {
		res = r.dict(p["Resources"])
		p = r.dict(p["Parent"])
	}
	rs := &resources{d: res}
	contents := r.resolve(d["Contents"])
	list, ok := contents.(array)
	if !ok {
		list = array{d["Contents"]}
	}
	r.out.separate('\n')
	for _, c := range list {
		s, _ := r.resolve(c).(*stream)
		if s == nil {
			continue
		}
		for _, data := range r.decode(s, true) {
			if err := r.interpret(data, rs, &r.out, 0); err != nil {
				return err
			}
		}
	}
	return r.out.flush()
}

// resources are the fonts and forms a content stream names.
type resources struct {
	d     dict
	fonts map[name]decoder
}

func (rs *resources) font(r *reader, n name) decoder {
	if d, ok := rs.fonts[n]; ok {
		return d
	}
	if rs.fonts == nil {
		rs.fonts = map[name]decoder{}
	}
	fd := r.dict(rs.d["Font"])
	v := fd[n]
	var dec decoder
	if rf, ok := v.(ref); ok && r.fonts[rf.num] != nil {
		dec = r.fonts[rf.num]
	} else {
		dec = r.fontDecoder(r.dict(v))
		if ok {
			r.fonts[rf.num] = dec
		}
	}
	rs.fonts[n] = dec
	return dec
}

// maxFormDepth bounds the nesting of forms.
const maxFormDepth = 12

// formKey is a form and, when it has no resources of its own, the
// resources it inherits.
type formKey struct {
	num int64
	res *resources
}

// form shows the form XObject n: its text, computed once.
func (r *reader) form(rs *resources, n name, out *textOut, depth int) error {
	rf, _ := r.dict(rs.d["XObject"])[n].(ref)
	s, _ := r.resolve(rf).(*stream)
	if s == nil || s.dict["Subtype"] != name("Form") || depth >= maxFormDepth || r.active[rf.num] {
		return nil
	}
	sub := rs
	if d := r.dict(s.dict["Resources"]); d != nil {
		sub = nil
	}
	key := formKey{rf.num, sub}
	text, ok := r.forms[key]
	if !ok {
		if sub == nil {
			sub = &resources{d: r.dict(s.dict["Resources"])}
		}
		r.active[rf.num] = true
		fo := &textOut{keep: r.b}
		for _, data := range r.decode(s, true) {
			if err := r.interpret(data, sub, fo, depth+1); err != nil {
				return err
			}
		}
		delete(r.active, rf.num)
		text = fo.buf
		r.forms[key] = text
	}
	if !r.b.step(16 + len(text)/4) {
		return errBound
	}
	out.separate('\n')
	return out.text(text)
}

// maxOperands bounds the operand stack of the interpreter.
const maxOperands = 8

// operand is one operand of a content operator: a number, a name, a
// string (shown), or an array of strings and spacings (shown by TJ).
type operand struct {
	kind tokKind // tInt or tReal, tName, tStr, tArrL, or tWord for another value
	num  float64
	str  []byte
	gaps []int // for an array: where in str a word gap falls
}

type interp struct {
	r     *reader
	l     lexer
	rs    *resources
	out   *textOut
	depth int
	font  decoder
	ops   []operand
	buf   []byte
}

// interpret runs a content stream.
func (r *reader) interpret(data []byte, rs *resources, out *textOut, depth int) error {
	in := &interp{r: r, l: lexer{data: data, b: r.b}, rs: rs, out: out, depth: depth, font: latin1{}}
	for {
		t := in.l.next()
		switch t.kind {
		case tEOF:
			if r.b.over {
				return errBound
			}
			return out.err
		case tInt, tReal:
			in.push(operand{kind: tInt, num: t.real})
		case tName:
			in.push(operand{kind: tName, str: data[t.start:t.end]})
		case tStr, tHex:
			in.push(operand{kind: tStr, str: in.l.str(t, nil)})
		case tArrL:
			in.push(in.array())
		case tDictL:
			in.skipDict()
			in.push(operand{kind: tWord})
		case tWord:
			if err := in.operator(data[t.start:t.end]); err != nil {
				return err
			}
			in.ops = in.ops[:0]
		}
	}
}

func (in *interp) push(o operand) {
	if len(in.ops) == maxOperands {
		in.ops = append(in.ops[:0], in.ops[1:]...)
	}
	in.ops = append(in.ops, o)
}

// arg returns the i-th operand from the top.
func (in *interp) arg(i int) operand {
	if i >= len(in.ops) {
		return operand{}
	}
	return in.ops[len(in.ops)-1-i]
}

// array reads an array operand: its strings, nested arrays flattened, and
// where a spacing wider than a fifth of the font size makes a word gap.
func (in *interp) array() operand {
	a := operand{kind: tArrL}
	for depth := 1; depth > 0; {
		t := in.l.next()
		switch t.kind {
		case tEOF:
			return a
		case tArrL:
			depth++
		case tArrR:
			depth--
		case tStr, tHex:
			a.str = in.l.str(t, a.str)
		case tInt, tReal:
			if t.real < -200 {
				a.gaps = append(a.gaps, len(a.str))
			}
		}
	}
	return a
}

func (in *interp) skipDict() {
	for depth := 1; depth > 0; {
		switch in.l.next().kind {
		case tEOF:
			return
		case tDictL:
			depth++
		case tDictR:
			depth--
		}
	}
}

func (in *interp) operator(op []byte) error {
	switch string(op) {
	case "BT", "T*", "Tm", "TD", "Td":
		in.out.separate('\n')
	case "Tf":
		if n := in.arg(1); n.kind == tName {
			in.font = in.rs.font(in.r, nameOf(n.str))
		}
	case "Tj":
		return in.show(in.arg(0).str)
	case "'", "\"":
		in.out.separate('\n')
		return in.show(in.arg(0).str)
	case "TJ":
		a := in.arg(0)
		if a.kind != tArrL {
			return nil
		}
		at := 0
		for _, g := range a.gaps {
			if err := in.show(a.str[at:g]); err != nil {
				return err
			}
			in.out.separate(' ')
			at = g
		}
		return in.show(a.str[at:])
	case "Do":
		if n := in.arg(0); n.kind == tName {
			return in.r.form(in.rs, nameOf(n.str), in.out, in.depth)
		}
	case "BI":
		in.l.pos = skipInlineImage(in.l.data, in.l.pos)
	}
	return nil
}

// show writes a shown string through the current font, a piece at a time.
func (in *interp) show(s []byte) error {
	for len(s) > 0 {
		n := min(len(s), 1024)
		in.buf = in.font.decode(in.buf[:0], s[:n])
		if err := in.out.text(in.buf); err != nil {
			return err
		}
		if !in.r.b.step(1) {
			return errBound
		}
		s = s[n:]
	}
	return nil
}

// skipInlineImage returns where the image data after ID ends: after an EI
// between white space.
func skipInlineImage(c []byte, i int) int {
	k := bytes.Index(c[i:], []byte("ID"))
	if k < 0 {
		return len(c)
	}
	for i += k + 3; i < len(c); {
		k := bytes.Index(c[i:], []byte("EI"))
		if k < 0 {
			return len(c)
		}
		e := i + k
		if isSpace(c[e-1]) && (e+2 == len(c) || !isRegular(c[e+2])) {
			return e + 2
		}
		i = e + 2
	}
	return len(c)
}

// latin1 reads each byte as one character.
type latin1 struct{}

func (latin1) decode(dst, raw []byte) []byte {
	for _, c := range raw {
		dst = utf8.AppendRune(dst, rune(c))
	}
	return dst
}
