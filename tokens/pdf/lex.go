package pdf

import (
	"errors"
	"strconv"
)

// This file mirrors, rule for rule, the object syntax of the library's lexer
// (github.com/ledongthuc/pdf lex.go). It is not used to read text: the
// structure check (check.go) parses with it exactly the objects the library
// will parse while opening a file and resolving objects in object streams,
// so that a number the library would act on (an xref /Size, an object
// stream's /N, a filter chain) is known, and bounded, before the library
// sees it. Where the library panics, this lexer fails with errSyntax; the
// two must agree on every input the library accepts. The fuzz target
// FuzzLexAgreement compares them.

var errSyntax = errors.New("pdf: syntax")

type (
	keyword string
	pdfName string
	dict    map[pdfName]any
	array   []any
	objref  struct {
		id  uint32
		gen uint16
	}
	objdef struct {
		ref objref
		obj any
	}
	// streamObj is a stream's dictionary and the offset of its data.
	streamObj struct {
		hdr    dict
		offset int64
	}
	eofToken struct{}
)

// maxLexDepth is the library's maxObjectDepth.
const maxLexDepth = 1000

// lexer reads objects from src[pos:], like the library's buffer over a
// section of the file that ends at len(src).
type lexer struct {
	src         []byte
	pos         int
	unread      []any
	allowEOF    bool
	allowObjptr bool
	allowStream bool
	eof         bool
	depth       int
	// work, when set, is the number of bytes the lexer may still read,
	// shared by the lexers of one task; past it the parse fails.
	work *int
	// lenient reads strings and names as pdf.js does where the library
	// fails (an unknown escape, a bad hex digit). Only the search for
	// encryption dictionaries (crypt.go) sets it: the structure check must
	// fail where the library fails.
	lenient bool
}

func newLexer(src []byte, pos int) *lexer {
	return &lexer{src: src, pos: pos, allowObjptr: true, allowStream: true}
}

// lexFail aborts a parse; parse recovers it.
type lexFail struct{}

func (l *lexer) fail() { panic(lexFail{}) }

// parse runs f, turning a failed parse into errSyntax.
func parse[T any](f func() T) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(lexFail); !ok {
				panic(r)
			}
			err = errSyntax
		}
	}()
	return f(), nil
}

func (l *lexer) readByte() byte {
	if l.pos >= len(l.src) || l.pos < 0 {
		if l.allowEOF {
			l.eof = true
			return '\n'
		}
		l.fail()
	}
	if l.work != nil {
		if *l.work--; *l.work < 0 {
			l.fail()
		}
	}
	c := l.src[l.pos]
	l.pos++
	return c
}

func (l *lexer) unreadByte() {
	// At the end of input the library's buffer is empty, and unreading does
	// nothing; the '\n' it returned was never consumed.
	if l.eof && l.pos >= len(l.src) {
		return
	}
	if l.pos > 0 {
		l.pos--
	}
}

func (l *lexer) unreadToken(t any) { l.unread = append(l.unread, t) }

func (l *lexer) readToken() any {
	if n := len(l.unread); n > 0 {
		t := l.unread[n-1]
		l.unread = l.unread[:n-1]
		return t
	}
	c := l.readByte()
	for {
		if isSpace(c) {
			if l.eof {
				return eofToken{}
			}
			c = l.readByte()
		} else if c == '%' {
			for c != '\r' && c != '\n' {
				c = l.readByte()
			}
		} else {
			break
		}
	}
	switch c {
	case '<':
		if l.readByte() == '<' {
			return keyword("<<")
		}
		l.unreadByte()
		return l.readHexString()
	case '(':
		return l.readLiteralString()
	case '[', ']', '{', '}':
		return keyword(string(c))
	case '/':
		return l.readName()
	case '>':
		if l.readByte() == '>' {
			return keyword(">>")
		}
		l.unreadByte()
		l.fail()
	}
	if isDelim(c) {
		l.fail()
	}
	l.unreadByte()
	return l.readKeyword()
}

func (l *lexer) readHexString() any {
	if l.lenient {
		return l.readHexStringLenient()
	}
	var tmp []byte
	for {
		c := l.readByte()
		for isSpace(c) {
			if l.eof {
				// The library loops here for ever; check.go refuses every
				// input that could reach this point.
				l.fail()
			}
			c = l.readByte()
		}
		if c == '>' {
			break
		}
		c2 := l.readByte()
		for isSpace(c2) {
			if l.eof {
				l.fail()
			}
			c2 = l.readByte()
		}
		x := unhex(c)<<4 | unhex(c2)
		if x < 0 {
			l.fail()
		}
		tmp = append(tmp, byte(x))
	}
	return string(tmp)
}

// readHexStringLenient reads a hex string as pdf.js does: a character
// that is no hex digit is skipped, a lone last digit is a high nibble, and
// the end of the input ends the string.
func (l *lexer) readHexStringLenient() any {
	var tmp []byte
	hi := -1
	for l.pos < len(l.src) {
		c := l.readByte()
		if c == '>' {
			break
		}
		v := unhex(c)
		if v < 0 {
			continue
		}
		if hi < 0 {
			hi = v
			continue
		}
		tmp = append(tmp, byte(hi<<4|v))
		hi = -1
	}
	if hi >= 0 {
		tmp = append(tmp, byte(hi<<4))
	}
	return string(tmp)
}

func unhex(b byte) int {
	switch {
	case '0' <= b && b <= '9':
		return int(b) - '0'
	case 'a' <= b && b <= 'f':
		return int(b) - 'a' + 10
	case 'A' <= b && b <= 'F':
		return int(b) - 'A' + 10
	}
	return -1
}

func (l *lexer) readLiteralString() any {
	var tmp []byte
	depth := 1
Loop:
	for !l.eof {
		c := l.readByte()
		switch c {
		default:
			tmp = append(tmp, c)
		case '(':
			depth++
			tmp = append(tmp, c)
		case ')':
			if depth--; depth == 0 {
				break Loop
			}
			tmp = append(tmp, c)
		case '\\':
			switch c = l.readByte(); c {
			default:
				if !l.lenient {
					l.fail()
				}
				tmp = append(tmp, c)
			case 'n':
				tmp = append(tmp, '\n')
			case 'r':
				tmp = append(tmp, '\r')
			case 'b':
				tmp = append(tmp, '\b')
			case 't':
				tmp = append(tmp, '\t')
			case 'f':
				tmp = append(tmp, '\f')
			case '(', ')', '\\':
				tmp = append(tmp, c)
			case '\r':
				if l.readByte() != '\n' {
					l.unreadByte()
				}
			case '\n':
			case '0', '1', '2', '3', '4', '5', '6', '7':
				x := int(c - '0')
				for i := 0; i < 2; i++ {
					c = l.readByte()
					if c < '0' || c > '7' {
						l.unreadByte()
						break
					}
					x = x*8 + int(c-'0')
				}
				if x > 255 && !l.lenient {
					l.fail()
				}
				tmp = append(tmp, byte(x))
			}
		}
	}
	return string(tmp)
}

func (l *lexer) readName() any {
	var tmp []byte
	for {
		c := l.readByte()
		if isDelim(c) || isSpace(c) {
			l.unreadByte()
			break
		}
		if c == '#' {
			x := unhex(l.readByte())<<4 | unhex(l.readByte())
			if x < 0 && l.lenient {
				l.unreadByte()
				l.unreadByte()
				tmp = append(tmp, '#')
				continue
			}
			if x < 0 {
				l.fail()
			}
			tmp = append(tmp, byte(x))
			continue
		}
		tmp = append(tmp, c)
	}
	return pdfName(tmp)
}

func (l *lexer) readKeyword() any {
	start := l.pos
	for {
		c := l.readByte()
		if isDelim(c) || isSpace(c) {
			l.unreadByte()
			break
		}
	}
	end := l.pos
	if end > len(l.src) {
		end = len(l.src)
	}
	s := string(l.src[start:end])
	switch {
	case s == "true":
		return true
	case s == "false":
		return false
	case isInteger(s):
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			l.fail()
		}
		return x
	case isReal(s):
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			l.fail()
		}
		return x
	}
	return keyword(s)
}

func isInteger(s string) bool {
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || '9' < s[i] {
			return false
		}
	}
	return true
}

func isReal(s string) bool {
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	if len(s) == 0 {
		return false
	}
	ndot := 0
	for _, c := range s {
		if c == '.' {
			ndot++
			continue
		}
		if c < '0' || '9' < c {
			return false
		}
	}
	return ndot == 1
}

func (l *lexer) readObject() any {
	l.depth++
	defer func() { l.depth-- }()
	if l.depth > maxLexDepth {
		l.fail()
	}
	tok := l.readToken()
	if kw, ok := tok.(keyword); ok {
		switch kw {
		case "null":
			return nil
		case "<<":
			return l.readDict()
		case "[":
			return l.readArray()
		case ">>", "]":
			return nil
		}
		l.fail()
	}
	if !l.allowObjptr {
		return tok
	}
	if t1, ok := tok.(int64); ok && int64(uint32(t1)) == t1 {
		tok2 := l.readToken()
		if t2, ok := tok2.(int64); ok && int64(uint16(t2)) == t2 {
			tok3 := l.readToken()
			switch tok3 {
			case keyword("R"):
				return objref{uint32(t1), uint16(t2)}
			case keyword("obj"):
				obj := l.readObject()
				if _, ok := obj.(streamObj); !ok {
					if l.readToken() != keyword("endobj") {
						l.fail()
					}
				}
				return objdef{objref{uint32(t1), uint16(t2)}, obj}
			}
			l.unreadToken(tok3)
		}
		l.unreadToken(tok2)
	}
	return tok
}

func (l *lexer) readArray() any {
	var x array
	for {
		tok := l.readToken()
		if tok == nil || tok == (eofToken{}) || tok == keyword("]") {
			break
		}
		l.unreadToken(tok)
		x = append(x, l.readObject())
	}
	return x
}

func (l *lexer) readDict() any {
	x := make(dict)
	for {
		tok := l.readToken()
		if tok == nil || tok == keyword(">>") || tok == (eofToken{}) {
			break
		}
		n, ok := tok.(pdfName)
		if !ok {
			l.fail()
		}
		x[n] = l.readObject()
	}
	if !l.allowStream {
		return x
	}
	tok := l.readToken()
	if tok != keyword("stream") {
		l.unreadToken(tok)
		return x
	}
	switch l.readByte() {
	case '\r':
		if l.readByte() != '\n' {
			l.unreadByte()
		}
	case '\n':
	default:
		l.fail()
	}
	return streamObj{x, int64(l.pos)}
}

func isSpace(b byte) bool {
	switch b {
	case '\x00', '\t', '\n', '\f', '\r', ' ':
		return true
	}
	return false
}

func isDelim(b byte) bool {
	switch b {
	case '<', '>', '(', ')', '[', ']', '{', '}', '/', '%':
		return true
	}
	return false
}
