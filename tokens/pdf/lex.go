package pdf

import "bytes"

// The lexer and the object parser. One lexer reads the file, object
// streams, content streams and CMaps; every token is a step of the budget
// (a long token one step per 64 bytes), so no input makes it work more
// than linearly.

// The values of PDF objects.
type (
	name  string
	ref   struct{ num int64 }
	dict  map[name]any
	array []any
	// A string's bytes; int64 and float64 are numbers, bool and nil too.
	pstring []byte
)

type tokKind uint8

const (
	tEOF   tokKind = iota
	tInt           // an integer: num
	tReal          // a real number: real
	tName          // /Name: start is after the slash
	tStr           // (literal): start and end enclose it, parentheses included
	tHex           // <hex>: likewise
	tDictL         // <<
	tDictR         // >>
	tArrL          // [
	tArrR          // ]
	tWord          // a keyword or operator: obj, R, Tj, true, …
	tBad           // a delimiter out of place, or a string open at the end
)

type token struct {
	kind       tokKind
	start, end int
	num        int64
	real       float64
}

type lexer struct {
	data []byte
	pos  int
	b    *budget
	// text, when set, collects the spans of strings and comments: text
	// inside the structure, which a reader of the file as text sees and
	// no page shows. They are costed as text.
	text *[]span
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == 0
}

func isDelim(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '[', ']', '{', '}', '/', '%':
		return true
	}
	return false
}

func isRegular(c byte) bool { return !isSpace(c) && !isDelim(c) }

// skipSpace passes white space and comments.
func (l *lexer) skipSpace() {
	for l.pos < len(l.data) {
		c := l.data[l.pos]
		switch {
		case isSpace(c):
			l.pos++
		case c == '%':
			from := l.pos
			for l.pos < len(l.data) && l.data[l.pos] != '\n' && l.data[l.pos] != '\r' {
				l.pos++
			}
			if c := l.data[from:l.pos]; len(c) > 6 && !bytes.HasPrefix(c, []byte("%PDF-")) && !bytes.HasPrefix(c, []byte("%%EOF")) {
				l.keepText(from, l.pos) // but the header, the end and the binary marker
			}
		default:
			return
		}
	}
}

// next reads one token; past the budget it reads tEOF.
func (l *lexer) next() token {
	l.skipSpace()
	t := l.scan()
	if !l.b.step(16 + (t.end-t.start)>>1) {
		return token{kind: tEOF, start: len(l.data), end: len(l.data)}
	}
	if t.kind == tStr || t.kind == tHex {
		l.keepText(t.start, t.end)
	}
	l.pos = t.end
	return t
}

// keepText records [from, to) as text when the lexer collects it.
func (l *lexer) keepText(from, to int) {
	if l.text != nil && to > from {
		*l.text = append(*l.text, span{from, to})
	}
}

func (l *lexer) scan() token {
	d, i := l.data, l.pos
	if i >= len(d) {
		return token{kind: tEOF, start: i, end: i}
	}
	t := token{start: i, end: i + 1}
	switch c := d[i]; c {
	case '/':
		t.kind, t.start, t.end = tName, i+1, l.regularEnd(i+1)
	case '(':
		t.kind, t.end = tStr, literalEnd(d, i+1)
		if t.end < 0 {
			t.kind, t.end = tBad, len(d)
		}
	case '<':
		if i+1 < len(d) && d[i+1] == '<' {
			t.kind, t.end = tDictL, i+2
			break
		}
		t.kind, t.end = tHex, i+1
		for t.end < len(d) && (isSpace(d[t.end]) || unhex(d[t.end]) >= 0) {
			t.end++
		}
		if t.end >= len(d) || d[t.end] != '>' {
			t.kind = tBad
		} else {
			t.end++
		}
	case '>':
		t.kind = tBad
		if i+1 < len(d) && d[i+1] == '>' {
			t.kind, t.end = tDictR, i+2
		}
	case '[':
		t.kind = tArrL
	case ']':
		t.kind = tArrR
	case ')', '{', '}':
		t.kind = tBad
		if c != ')' {
			t.kind = tWord // PostScript braces: words a content stream ignores
		}
	default:
		t.end = l.regularEnd(i)
		t.kind = tWord
		numberToken(d[i:t.end], &t)
	}
	return t
}

func (l *lexer) regularEnd(i int) int {
	for i < len(l.data) && isRegular(l.data[i]) {
		i++
	}
	return i
}

// numberToken makes t a number when s is one (123, -4.5, .5, 4.).
func numberToken(s []byte, t *token) {
	if len(s) == 0 || len(s) > 32 {
		return
	}
	i, neg := 0, false
	if s[0] == '+' || s[0] == '-' {
		neg, i = s[0] == '-', 1
	}
	var v int64
	var f, scale float64 = 0, 0
	digits := 0
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
			v = v*10 + int64(c-'0')
			f = f*10 + float64(c-'0')
			if scale != 0 {
				scale *= 10
			}
		case c == '.' && scale == 0:
			scale = 1
		default:
			return
		}
	}
	if digits == 0 {
		return
	}
	if neg {
		v, f = -v, -f
	}
	if scale == 0 && digits < 19 {
		t.kind, t.num, t.real = tInt, v, float64(v)
		return
	}
	t.kind, t.real = tReal, f/max(scale, 1)
}

// literalEnd returns the index after the ')' that closes a literal string
// whose '(' is before i, or -1.
func literalEnd(d []byte, i int) int {
	depth := 1
	for ; i < len(d); i++ {
		switch d[i] {
		case '\\':
			i++
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// str returns the bytes of a string token, appended to dst.
func (l *lexer) str(t token, dst []byte) []byte {
	if t.kind == tHex {
		return hexString(l.data[t.start+1:t.end-1], dst)
	}
	return literalString(l.data[t.start+1:t.end-1], dst)
}

func hexString(s, dst []byte) []byte {
	hi := -1
	for _, c := range s {
		v := unhex(c)
		switch {
		case v < 0:
		case hi < 0:
			hi = v
		default:
			dst = append(dst, byte(hi<<4|v))
			hi = -1
		}
	}
	if hi >= 0 {
		dst = append(dst, byte(hi<<4))
	}
	return dst
}

func literalString(s, dst []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			dst = append(dst, c)
			continue
		}
		i++
		switch e := s[i]; e {
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case '\r':
			if i+1 < len(s) && s[i+1] == '\n' {
				i++
			}
		case '\n':
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(e - '0')
			for k := 0; k < 2 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '7'; k++ {
				i++
				v = v*8 + int(s[i]-'0')
			}
			dst = append(dst, byte(v))
		default:
			dst = append(dst, e)
		}
	}
	return dst
}

// nameOf decodes a name token's #xx escapes.
func (l *lexer) nameOf(t token) name { return nameOf(l.data[t.start:t.end]) }

func nameOf(s []byte) name {
	for _, c := range s {
		if c == '#' {
			return name(unescapeName(s))
		}
	}
	return name(s)
}

func unescapeName(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '#' && i+2 < len(s) && unhex(s[i+1]) >= 0 && unhex(s[i+2]) >= 0 {
			out = append(out, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
			i += 2
			continue
		}
		out = append(out, s[i])
	}
	return out
}

// maxDepth bounds the nesting of arrays and dictionaries: a deeper object
// does not parse (its bytes are costed as text).
const maxDepth = 32

// heldValue is what one parsed value is charged to the memory budget.
const heldValue = 32

// value parses the value that starts with t; ok is false when it does not
// parse. Every value is charged to the budget as held memory.
func (l *lexer) value(t token, depth int) (any, bool) {
	if !l.b.take(heldValue) {
		return nil, false
	}
	switch t.kind {
	case tInt:
		// N G R is a reference.
		save := l.pos
		if g := l.next(); g.kind == tInt {
			if r := l.next(); r.kind == tWord && l.word(r) == "R" {
				return ref{t.num}, true
			}
		}
		l.pos = save
		return t.num, true
	case tReal:
		return t.real, true
	case tName:
		return l.nameOf(t), true
	case tStr, tHex:
		return pstring(l.str(t, nil)), true
	case tArrL:
		return l.array(depth)
	case tDictL:
		return l.dict(depth)
	case tWord:
		switch l.word(t) {
		case "true":
			return true, true
		case "false":
			return false, true
		case "null":
			return nil, true
		}
	}
	return nil, false
}

func (l *lexer) word(t token) string { return string(l.data[t.start:t.end]) }

func (l *lexer) array(depth int) (any, bool) {
	if depth >= maxDepth {
		return nil, false
	}
	var a array
	for {
		t := l.next()
		if t.kind == tArrR {
			return a, true
		}
		v, ok := l.value(t, depth+1)
		if !ok {
			return nil, false
		}
		a = append(a, v)
	}
}

func (l *lexer) dict(depth int) (any, bool) {
	if depth >= maxDepth {
		return nil, false
	}
	d := dict{}
	for {
		t := l.next()
		if t.kind == tDictR {
			return d, true
		}
		if t.kind != tName {
			return nil, false
		}
		k := l.nameOf(t)
		v, ok := l.value(l.next(), depth+1)
		if !ok {
			return nil, false
		}
		d[k] = v
	}
}
