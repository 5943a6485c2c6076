package pdf

import "bytes"

// The scan: the file is read once from start to end, not through its
// cross-reference tables (which may lie, or point elsewhere than other
// readers look): every `N G obj … endobj` found is an object, a later
// definition of a number replacing an earlier one, as an incremental
// update does. Object streams are decoded once and their objects parsed
// once. Every byte the scan parses as structure (objects, the cross-
// reference tables and trailers, comments and white space) is covered;
// stream data is covered when it decodes, or is recognised as image data.

// object is one definition of an object.
type object struct {
	pos int // where it was defined: its offset, or its object stream's
	idx int // its place in its object stream
	val any
	stm *stream // the stream, when it is one
}

// stream is a stream object.
type stream struct {
	num   int64
	dict  dict
	raw   []byte // the data, undecoded
	from  int    // the data's offset in the file
	state streamState
	data  [][]byte // the decoded data (one variant per filter reading), kept for text
}

type streamState uint8

const (
	undone  streamState = iota
	decoded             // every reading of it decoded whole
	image               // image data: not text
	failed              // undecodable, damaged or encrypted: its data is text
)

type reader struct {
	lim        Limits
	opaque     func([]byte) error // see ReadWith
	data       []byte
	b          *budget
	maxPages   int
	file       coverage
	decodedCov []*coverage // the decoded object streams
	objs       map[int64]*object
	streams    []*stream
	encrypted  bool
	out        textOut

	endstream span // the last search for "endstream": from, found (-1: none)
	fonts     map[int64]decoder
	forms     map[formKey][]byte
	active    map[int64]bool
}

func newReader(data []byte, lim Limits, sink func([]byte) error) *reader {
	return &reader{
		data: data, b: &budget{steps: lim.MaxSteps, bytes: lim.MaxDecoded}, maxPages: lim.MaxPages,
		file: coverage{buf: data}, objs: map[int64]*object{},
		out:       textOut{sink: sink},
		endstream: span{-1, 0},
		fonts:     map[int64]decoder{}, forms: map[formKey][]byte{}, active: map[int64]bool{},
	}
}

func (r *reader) scan() {
	l := &lexer{data: r.data, b: r.b, text: &r.file.text}
	for !r.b.over {
		at := l.pos
		l.skipSpace()
		r.file.cover(at, l.pos)
		if l.pos >= len(r.data) {
			return
		}
		if r.structure(l) {
			continue
		}
		// Not structure: its bytes are text. Go on past one token.
		if !r.b.step(1) {
			return
		}
		if end := l.regularEnd(l.pos); end > l.pos {
			l.pos = end
		} else {
			l.pos++
		}
	}
}

// structure parses the top-level structure at l.pos and covers it, or
// reports false (l.pos unchanged).
func (r *reader) structure(l *lexer) bool {
	at := l.pos
	t := l.next()
	switch {
	case t.kind == tInt:
		if r.object(l, t) {
			return true
		}
	case t.kind != tWord:
	case l.word(t) == "xref":
		// Rows of numbers and n/f keywords: read as structure, not trusted.
		end := t.end
		for {
			u := l.next()
			if u.kind != tInt && (u.kind != tWord || l.word(u) != "n" && l.word(u) != "f") {
				break
			}
			end = u.end
		}
		l.pos = end
		r.file.cover(at, end)
		return true
	case l.word(t) == "trailer":
		if v, ok := l.value(l.next(), 0); ok {
			if d, _ := v.(dict); d != nil && d["Encrypt"] != nil {
				r.encrypted = true
			}
			r.file.cover(at, l.pos)
			return true
		}
	case l.word(t) == "startxref":
		if u := l.next(); u.kind == tInt {
			r.file.cover(at, u.end)
			return true
		}
	}
	l.pos = at
	return false
}

// object parses `N G obj value [stream … endstream] [endobj]`.
func (r *reader) object(l *lexer, num token) bool {
	at := num.start
	if gen := l.next(); gen.kind != tInt || num.num < 0 {
		return false
	}
	if kw := l.next(); kw.kind != tWord || l.word(kw) != "obj" {
		return false
	}
	t := l.next()
	var v any
	if t.kind == tWord && l.word(t) == "endobj" {
		r.file.cover(at, t.end)
		r.define(num.num, &object{pos: at})
		return true
	}
	v, ok := l.value(t, 0)
	if !ok {
		return false
	}
	o := &object{pos: at, val: v}
	end := l.pos
	kw := l.next()
	d, _ := v.(dict)
	if d != nil && kw.kind == tWord && l.word(kw) == "stream" {
		o.stm = r.streamBody(l, num.num, d, kw.end)
		r.file.cover(at, o.stm.from)
		end = l.pos
		kw = l.next()
	} else {
		r.file.cover(at, end)
	}
	if kw.kind == tWord && l.word(kw) == "endobj" {
		r.file.cover(end, kw.end)
	} else {
		l.pos = end
	}
	r.define(num.num, o)
	return true
}

// streamBody reads the data of a stream whose keyword ends at i: up to
// /Length when `endstream` follows it, else up to the next `endstream`,
// else up to /Length, else to the end of the file. It leaves l after the
// data, covering the data's end of line and `endstream`.
func (r *reader) streamBody(l *lexer, num int64, d dict, i int) *stream {
	if i < len(r.data) && r.data[i] == '\r' {
		i++
	}
	if i < len(r.data) && r.data[i] == '\n' {
		i++
	}
	end := -1
	n, known := r.int(d["Length"])
	if known && n >= 0 && n <= int64(len(r.data)-i) && r.endsAt(i+int(n)) {
		end = i + int(n)
	} else if e := r.nextEndstream(i); e >= 0 {
		end = e
	} else if known && n >= 0 && n <= int64(len(r.data)-i) {
		end = i + int(n)
	} else {
		end = len(r.data)
	}
	s := &stream{num: num, dict: d, raw: r.data[i:end], from: i}
	r.streams = append(r.streams, s)
	if d["Type"] == name("XRef") && d["Encrypt"] != nil {
		r.encrypted = true
	}
	l.pos = end
	at := l.pos
	l.skipSpace()
	if bytes.HasPrefix(r.data[l.pos:], []byte("endstream")) {
		l.pos += len("endstream")
		r.file.cover(at, l.pos)
	} else {
		l.pos = at
	}
	return s
}

// endsAt reports whether `endstream` follows i after white space.
func (r *reader) endsAt(i int) bool {
	for i < len(r.data) && isSpace(r.data[i]) {
		i++
	}
	return bytes.HasPrefix(r.data[i:], []byte("endstream"))
}

// nextEndstream returns where the data before the next `endstream` from i
// ends (its end of line excluded), or -1. It remembers its last search,
// so that the scan searches every byte once.
func (r *reader) nextEndstream(i int) int {
	k := -1
	if e := r.endstream; e.from >= 0 && i >= e.from && (e.to < 0 || i <= e.to) {
		k = e.to
	} else {
		k = bytes.Index(r.data[i:], []byte("endstream"))
		r.b.step(16 + (len(r.data)-i)/16)
		if k >= 0 {
			k += i
		}
		r.endstream = span{i, k}
	}
	if k < 0 {
		return -1
	}
	e := k
	if e > i && r.data[e-1] == '\n' {
		e--
	}
	if e > i && r.data[e-1] == '\r' {
		e--
	}
	return e
}

// define records a definition of object num; the later one wins.
func (r *reader) define(num int64, o *object) {
	if old := r.objs[num]; old == nil || o.pos > old.pos || o.pos == old.pos && o.idx >= old.idx {
		r.objs[num] = o
	}
}

// resolve follows references (a bounded number of them).
func (r *reader) resolve(v any) any {
	for i := 0; i < 8; i++ {
		rf, ok := v.(ref)
		if !ok {
			return v
		}
		r.b.step(1)
		o := r.objs[rf.num]
		if o == nil {
			return nil
		}
		if o.stm != nil {
			return o.stm
		}
		v = o.val
	}
	return nil
}

func (r *reader) dict(v any) dict {
	switch v := r.resolve(v).(type) {
	case dict:
		return v
	case *stream:
		return v.dict
	}
	return nil
}

func (r *reader) int(v any) (int64, bool) {
	switch v := r.resolve(v).(type) {
	case int64:
		return v, true
	case float64:
		if v == float64(int64(v)) {
			return int64(v), true
		}
	}
	return 0, false
}

// unpackObjStms decodes each object stream once and parses its objects,
// each once: they are defined at the object stream's place in the file.
func (r *reader) unpackObjStms() {
	for _, s := range r.streams {
		if s.dict["Type"] != name("ObjStm") {
			continue
		}
		vs := r.decode(s, true)
		if len(vs) == 0 || r.b.over {
			continue
		}
		data := vs[0]
		c := &coverage{buf: data}
		r.decodedCov = append(r.decodedCov, c)
		first, ok := r.int(s.dict["First"])
		if !ok || first < 0 || first > int64(len(data)) {
			continue
		}
		// The header: pairs of numbers, read as far as they go.
		l := &lexer{data: data[:first], b: r.b}
		type entry struct{ num, off int64 }
		var ents []entry
		for {
			a, b := l.next(), l.next()
			if a.kind != tInt || b.kind != tInt {
				break
			}
			ents = append(ents, entry{a.num, b.num})
			c.cover(a.start, b.end)
		}
		for i, e := range ents {
			if e.off < 0 || first+e.off >= int64(len(data)) {
				continue
			}
			l := &lexer{data: data, pos: int(first + e.off), b: r.b, text: &c.text}
			if v, ok := l.value(l.next(), 0); ok {
				c.cover(int(first+e.off), l.pos)
				r.define(e.num, &object{pos: s.from, idx: i + 1, val: v})
			}
		}
	}
}

// sweep decodes every stream not decoded yet, for its data to be covered
// when it decodes; then covers the data of those that did.
func (r *reader) sweep() error {
	for _, s := range r.streams {
		if s.state == undone {
			datas := r.decode(s, false)
			if r.opaque == nil || s.state != decoded {
				datas = nil
			}
			for _, data := range datas {
				if err := r.opaque(data); err != nil {
					r.out.err = err
					return err
				}
			}
		}
		if r.b.over {
			return errBound
		}
		if s.state == decoded || s.state == image {
			r.file.cover(s.from, s.from+len(s.raw))
		}
		s.data = nil
	}
	return nil
}
