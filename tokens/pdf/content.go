package pdf

import (
	"bytes"
	"unicode/utf8"
)

// The content-stream interpreter. It reads the text-showing operators of a
// page's content (Tj, TJ, ', "), with Tf to choose the font that decodes
// the strings and Do to enter form XObjects, and writes the text to a
// textOut. It is this package's own code, not the library's Interpret: it
// keeps at most maxOperands operands (the library's stack grows with the
// stream), skips inline image data, and checks the budget as it goes.

// textOut buffers text for the sink and hands it over in pieces.
type textOut struct {
	buf  []byte
	sink func([]byte) error
	err  error // the sink's error, once it returned one
	n    int64 // bytes handed to the sink
	sep  byte  // separator owed before the next text, or 0
}

const outChunk = 4096

func (o *textOut) flush() error {
	if o.err != nil {
		return o.err
	}
	if len(o.buf) == 0 {
		return nil
	}
	o.n += int64(len(o.buf))
	if err := o.sink(o.buf); err != nil {
		o.err = err
		return err
	}
	o.buf = o.buf[:0]
	return nil
}

// text appends decoded text, first writing any owed separator.
func (o *textOut) text(p []byte) error {
	if len(p) == 0 {
		return o.err
	}
	if o.sep != 0 {
		o.buf = append(o.buf, o.sep)
		o.sep = 0
	}
	o.buf = append(o.buf, p...)
	if len(o.buf) >= outChunk {
		return o.flush()
	}
	return o.err
}

// separate owes a separator (space or newline) before the next text.
func (o *textOut) separate(c byte) {
	if o.n == 0 && len(o.buf) == 0 {
		return
	}
	if o.sep != '\n' {
		o.sep = c
	}
}

// decoder turns a shown string into UTF-8 text, appending to dst.
type decoder interface {
	decode(dst, raw []byte) []byte
}

// rawDecoder reads strings without a font: UTF-16BE with a byte order mark,
// else one character per byte (Latin-1). It is what the scan uses, and the
// fallback for a font that cannot be read.
type rawDecoder struct{}

func (rawDecoder) decode(dst, raw []byte) []byte {
	if len(raw) >= 2 && raw[0] == 0xfe && raw[1] == 0xff {
		return appendUTF16(dst, raw[2:])
	}
	for _, c := range raw {
		if c < utf8.RuneSelf {
			dst = append(dst, c)
		} else {
			dst = utf8.AppendRune(dst, rune(c))
		}
	}
	return dst
}

func appendUTF16(dst, raw []byte) []byte {
	for i := 0; i+1 < len(raw); i += 2 {
		u := rune(raw[i])<<8 | rune(raw[i+1])
		if u >= 0xd800 && u < 0xdc00 && i+3 < len(raw) {
			u2 := rune(raw[i+2])<<8 | rune(raw[i+3])
			if u2 >= 0xdc00 && u2 < 0xe000 {
				dst = utf8.AppendRune(dst, 0x10000+(u-0xd800)<<10+(u2-0xdc00))
				i += 2
				continue
			}
		}
		dst = utf8.AppendRune(dst, u)
	}
	if len(raw)%2 == 1 {
		dst = utf8.AppendRune(dst, rune(raw[len(raw)-1]))
	}
	return dst
}

// resources is what the interpreter asks of a page: fonts by name and form
// XObjects by name. The scan has none.
type resources interface {
	font(name []byte) decoder
	form(name []byte, depth int) error
}

// Operand kinds.
const (
	opNone = iota
	opNumber
	opString
	opName
	opArray
	opOther
)

type operand struct {
	kind int
	num  float64
	str  []byte // string bytes, name without '/', or array items' text pieces
	gaps []int  // opArray: offsets in str where a word gap falls
}

const (
	maxOperands = 16
	maxNesting  = 64
)

type interp struct {
	b     *budget
	out   *textOut
	res   resources // nil in the scan
	dec   decoder
	depth int // form XObject nesting

	ops     []operand
	arena   []byte // the bytes of the operands of the current operator
	scratch []byte
}

func newInterp(b *budget, out *textOut, res resources, depth int) *interp {
	return &interp{b: b, out: out, res: res, dec: rawDecoder{}, depth: depth}
}

func (in *interp) push(o operand) {
	if len(in.ops) >= maxOperands {
		copy(in.ops, in.ops[1:])
		in.ops = in.ops[:len(in.ops)-1]
	}
	in.ops = append(in.ops, o)
}

// arg returns the i-th operand from the top (0 is the last), or a none.
func (in *interp) arg(i int) operand {
	if i >= len(in.ops) {
		return operand{}
	}
	return in.ops[len(in.ops)-1-i]
}

// run interprets content, returning the sink's error or errOver.
func (in *interp) run(c []byte) error {
	i := 0
	// arrays under construction: text pieces and gaps of the innermost
	// array; deeper arrays are flattened into it.
	var arr operand
	arrDepth := 0
	dictDepth := 0
	for {
		if err := in.b.tick(); err != nil {
			return err
		}
		i = skipSpace(c, i)
		if i >= len(c) {
			return nil
		}
		ch := c[i]
		switch {
		case ch == '(' || ch == '<' && (i+1 >= len(c) || c[i+1] != '<'):
			n := len(in.arena)
			if ch == '(' {
				in.arena, i = literalString(c, i+1, in.arena)
			} else {
				in.arena, i = hexString(c, i+1, in.arena)
			}
			s := in.arena[n:len(in.arena):len(in.arena)]
			if arrDepth > 0 {
				arr.str = append(arr.str, s...)
				in.arena = in.arena[:n]
			} else if dictDepth == 0 {
				in.push(operand{kind: opString, str: s})
			} else {
				in.arena = in.arena[:n]
			}
		case ch == '<' && i+1 < len(c) && c[i+1] == '<':
			i += 2
			if dictDepth < maxNesting {
				dictDepth++
			}
		case ch == '>' && i+1 < len(c) && c[i+1] == '>':
			i += 2
			if dictDepth > 0 {
				dictDepth--
				if dictDepth == 0 && arrDepth == 0 {
					in.push(operand{kind: opOther})
				}
			}
		case ch == '[':
			i++
			if dictDepth > 0 {
				continue
			}
			if arrDepth == 0 {
				arr = operand{kind: opArray}
			}
			if arrDepth < maxNesting {
				arrDepth++
			}
		case ch == ']':
			i++
			if dictDepth > 0 || arrDepth == 0 {
				continue
			}
			arrDepth--
			if arrDepth == 0 {
				in.push(arr)
				arr = operand{}
			}
		case ch == '/':
			j := i + 1
			for j < len(c) && !isSpace(c[j]) && !isDelim(c[j]) {
				j++
			}
			if arrDepth == 0 && dictDepth == 0 {
				in.push(operand{kind: opName, str: c[i+1 : j]})
			}
			i = j
		case ch == '{' || ch == '}' || ch == ')' || ch == '>':
			i++
		default:
			j := i
			for j < len(c) && !isSpace(c[j]) && !isDelim(c[j]) {
				j++
			}
			tok := c[i:j]
			i = j
			if n, ok := number(tok); ok {
				if arrDepth > 0 {
					// A displacement of more than a fifth of the font size
					// reads as a word gap.
					if n < -200 {
						arr.gaps = append(arr.gaps, len(arr.str))
					}
				} else if dictDepth == 0 {
					in.push(operand{kind: opNumber, num: n})
				}
				continue
			}
			if arrDepth > 0 || dictDepth > 0 {
				continue
			}
			var err error
			i, err = in.operator(tok, c, i)
			if err != nil {
				return err
			}
			// The operands are consumed: their bytes may be reused.
			in.ops = in.ops[:0]
			in.arena = in.arena[:0]
		}
	}
}

// operator runs one operator; it may move i (past inline image data).
func (in *interp) operator(op []byte, c []byte, i int) (int, error) {
	switch string(op) {
	case "BT":
		in.out.separate('\n')
	case "T*":
		in.out.separate('\n')
	case "Td", "TD":
		if in.arg(0).num != 0 {
			in.out.separate('\n')
		} else {
			in.out.separate(' ')
		}
	case "Tm":
		in.out.separate('\n')
	case "Tf":
		if in.res != nil {
			if name := in.arg(1); name.kind == opName {
				in.dec = in.res.font(name.str)
			}
		}
	case "Tj":
		return i, in.show(in.arg(0))
	case "'":
		in.out.separate('\n')
		return i, in.show(in.arg(0))
	case "\"":
		in.out.separate('\n')
		return i, in.show(in.arg(0))
	case "TJ":
		a := in.arg(0)
		if a.kind != opArray {
			return i, nil
		}
		prev := 0
		for _, g := range a.gaps {
			if g > prev {
				if err := in.show(operand{kind: opString, str: a.str[prev:g]}); err != nil {
					return i, err
				}
			}
			in.out.separate(' ')
			prev = g
		}
		return i, in.show(operand{kind: opString, str: a.str[prev:]})
	case "Do":
		if in.res != nil {
			if name := in.arg(0); name.kind == opName {
				return i, in.res.form(name.str, in.depth+1)
			}
		}
	case "BI":
		return skipInlineImage(c, i), nil
	}
	return i, nil
}

// show writes one shown string through the current font, in pieces so
// that a font's decoder never works on more than a bounded input.
func (in *interp) show(o operand) error {
	if o.kind != opString || len(o.str) == 0 {
		return in.out.err
	}
	const piece = 1024
	s := o.str
	for len(s) > 0 {
		n := len(s)
		if n > piece {
			n = piece
		}
		in.scratch = in.dec.decode(in.scratch[:0], s[:n])
		if err := in.out.text(in.scratch); err != nil {
			return err
		}
		if err := in.b.tick(); err != nil {
			return err
		}
		s = s[n:]
	}
	return nil
}

func skipSpace(c []byte, i int) int {
	for i < len(c) {
		switch {
		case isSpace(c[i]):
			i++
		case c[i] == '%':
			for i < len(c) && c[i] != '\r' && c[i] != '\n' {
				i++
			}
		default:
			return i
		}
	}
	return i
}

// number parses a PDF number (123, -4.5, .5); ok is false for anything else.
func number(tok []byte) (float64, bool) {
	if len(tok) == 0 || len(tok) > 32 {
		return 0, false
	}
	i := 0
	neg := false
	if tok[0] == '+' || tok[0] == '-' {
		neg = tok[0] == '-'
		i++
	}
	var v, scale float64 = 0, 0
	digits := 0
	for ; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c >= '0' && c <= '9':
			digits++
			v = v*10 + float64(c-'0')
			if scale != 0 {
				scale *= 10
			}
		case c == '.' && scale == 0:
			scale = 1
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	if scale > 1 {
		v /= scale
	}
	if neg {
		v = -v
	}
	return v, true
}

// literalString reads a (string) whose '(' is before i, appending its bytes
// to dst; it returns the index after the closing ')'.
func literalString(c []byte, i int, dst []byte) ([]byte, int) {
	depth := 1
	for i < len(c) {
		ch := c[i]
		i++
		switch ch {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return dst, i
			}
		case '\\':
			if i >= len(c) {
				return dst, i
			}
			e := c[i]
			i++
			switch e {
			case 'n':
				ch = '\n'
			case 'r':
				ch = '\r'
			case 't':
				ch = '\t'
			case 'b':
				ch = '\b'
			case 'f':
				ch = '\f'
			case '\r':
				if i < len(c) && c[i] == '\n' {
					i++
				}
				continue
			case '\n':
				continue
			case '0', '1', '2', '3', '4', '5', '6', '7':
				v := int(e - '0')
				for k := 0; k < 2 && i < len(c) && c[i] >= '0' && c[i] <= '7'; k++ {
					v = v*8 + int(c[i]-'0')
					i++
				}
				ch = byte(v)
			default:
				ch = e
			}
		}
		dst = append(dst, ch)
	}
	return dst, i
}

// hexString reads a <hex string> whose '<' is before i.
func hexString(c []byte, i int, dst []byte) ([]byte, int) {
	hi := -1
	for i < len(c) {
		ch := c[i]
		i++
		if ch == '>' {
			break
		}
		v := unhex(ch)
		if v < 0 {
			continue
		}
		if hi < 0 {
			hi = v
			continue
		}
		dst = append(dst, byte(hi<<4|v))
		hi = -1
	}
	if hi >= 0 {
		dst = append(dst, byte(hi<<4))
	}
	return dst, i
}

// skipInlineImage skips from after BI past the image's EI.
func skipInlineImage(c []byte, i int) int {
	// The parameters run to the ID operator; the data starts one white-space
	// byte after it and ends at an EI between white space.
	for {
		i = skipSpace(c, i)
		if i >= len(c) {
			return i
		}
		if c[i] == 'I' && i+1 < len(c) && c[i+1] == 'D' && (i+2 == len(c) || isSpace(c[i+2])) {
			i += 3
			break
		}
		j := i + 1
		for j < len(c) && !isSpace(c[j]) && !isDelim(c[j]) {
			j++
		}
		i = j
	}
	for i < len(c) {
		k := bytes.Index(c[i:], []byte("EI"))
		if k < 0 {
			return len(c)
		}
		e := i + k
		if e > 0 && isSpace(c[e-1]) && (e+2 == len(c) || isSpace(c[e+2]) || isDelim(c[e+2])) {
			return e + 2
		}
		i = e + 2
	}
	return i
}
