package tokens

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonReader is a pull parser over a stream that hands string contents
// out in pieces and skips what it is not asked for, so memory stays
// bounded whatever the size of a value. encoding/json (and jsontext)
// would materialise every string, base64 images included, in full; the
// token cap must cost what the cap allows, not what the client sent.
// It validates as it goes: a syntax error is an *InvalidError.
type jsonReader struct {
	r     *bufio.Reader
	off   int64 // bytes consumed
	depth int
	// work, when set, is drawn on by every workElements-th container or
	// member read: tiny ones cost more to read than their bytes say.
	work     *work
	elements int
	// capture, when non-nil, receives every byte consumed (a raw copy of
	// the values read while it is set), up to captureMax.
	capture    []byte
	capturing  bool
	captureMax int
	overflow   bool // the captured value outgrew captureMax: capture holds its start
	// tee, when set while capturing, is handed the captured bytes in
	// pieces of about teeFlush bytes, and capture is emptied after each.
	tee    func([]byte) error
	strBuf [4096]byte // str's output buffer; str is never re-entered
	// fullKeys makes object hand field the whole member name (in keyAcc),
	// not only its first 256 bytes: schemas, whose member names the model
	// reads, are counted name and all.
	fullKeys bool
	keyAcc   []byte
	// u8 holds the start of a UTF-8 sequence cut at the end of a run of
	// plain string bytes, to be completed by the next run.
	u8  [utf8.UTFMax]byte
	u8n int
	// noUTF8Check skips validating strings as UTF-8: for a pass that only
	// looks for a member, followed by the count that validates what it
	// reads.
	noUTF8Check bool
}

const maxDepth = 256

// InvalidError is a body that cannot be parsed. Its message says where and
// why, never what the body contained.
type InvalidError struct {
	msg string
	// final: the body is refused whatever its type says (a repeated
	// decided member), never re-read as text.
	final bool
}

func (e *InvalidError) Error() string { return e.msg }

// errCaptureFull reports a captured value larger than its bound.
var errCaptureFull = errors.New("captured value too large")

// readers recycles jsonReaders: each holds a 16 KiB read buffer and a 4
// KiB string buffer that would otherwise be allocated and zeroed twice per
// request.
var readers = sync.Pool{New: func() any { return &jsonReader{r: bufio.NewReaderSize(nil, 16<<10)} }}

// newJSONReader returns a reader of r; release it with free.
func newJSONReader(r io.Reader) *jsonReader {
	j := readers.Get().(*jsonReader)
	j.r.Reset(r)
	j.off, j.depth, j.capture, j.capturing, j.captureMax, j.overflow = 0, 0, j.capture[:0], false, 0, false
	j.fullKeys, j.keyAcc, j.u8n, j.tee, j.noUTF8Check = false, j.keyAcc[:0], 0, nil, false
	return j
}

// free returns j to the pool; j must not be used after.
func (j *jsonReader) free() {
	j.r.Reset(nil)
	if cap(j.capture) > 64<<10 {
		j.capture = nil // do not keep a large captured tools array alive
	}
	if cap(j.keyAcc) > 64<<10 {
		j.keyAcc = nil
	}
	readers.Put(j)
}

func (j *jsonReader) fail(format string, args ...any) error {
	return &InvalidError{msg: fmt.Sprintf("invalid JSON at byte %d: ", j.off) + fmt.Sprintf(format, args...)}
}

func (j *jsonReader) readByte() (byte, error) {
	c, err := j.r.ReadByte()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, j.fail("unexpected end of input")
		}
		return 0, err
	}
	j.off++
	if j.capturing {
		if len(j.capture) < j.captureMax {
			j.capture = append(j.capture, c)
		} else {
			j.overflow = true
		}
		if j.tee != nil && len(j.capture) >= teeFlush {
			if err := j.flushTee(); err != nil {
				return 0, err
			}
		}
	}
	return c, nil
}

// peek skips whitespace and returns the next byte without consuming it.
func (j *jsonReader) peek() (byte, error) {
	for {
		b, err := j.r.Peek(1)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, j.fail("unexpected end of input")
			}
			return 0, err
		}
		switch b[0] {
		case ' ', '\t', '\n', '\r':
			j.readByte()
		default:
			return b[0], nil
		}
	}
}

// end checks that only whitespace follows the top-level value.
func (j *jsonReader) end() error {
	for {
		b, err := j.r.Peek(1)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch b[0] {
		case ' ', '\t', '\n', '\r':
			j.readByte()
		default:
			return j.fail("data after the top-level value")
		}
	}
}

func (j *jsonReader) expect(c byte) error {
	if _, err := j.peek(); err != nil {
		return err
	}
	got, err := j.readByte()
	if err != nil {
		return err
	}
	if got != c {
		return j.fail("expected %q", c)
	}
	return nil
}

// object reads an object; field is called for each key and must consume
// its value (with skip if it has no use for it).
func (j *jsonReader) object(field func(key []byte) error) error {
	var keyBuf [64]byte
	return j.container('{', '}', func(int) error {
		key := keyBuf[:0]
		var err error
		if j.fullKeys {
			j.keyAcc = j.keyAcc[:0]
			err = j.str(func(p []byte) error {
				j.keyAcc = append(j.keyAcc, p...)
				return nil
			})
			key = j.keyAcc
		} else {
			long := false
			err = j.str(func(p []byte) error {
				if long || len(key)+len(p) > 256 { // no key we look for, nor is its end:
					long, key = true, append(key[:0], 0xff) // it folds to U+FFFD, in no table
					return nil
				}
				key = append(key, p...)
				return nil
			})
		}
		if err != nil {
			return err
		}
		if err := j.expect(':'); err != nil {
			return err
		}
		if _, err := j.peek(); err != nil {
			return err
		}
		return field(key)
	})
}

// array reads an array; elem is called for each element and must consume it.
func (j *jsonReader) array(elem func(i int) error) error {
	return j.container('[', ']', elem)
}

// element counts one container or member read, a step of work every
// workElements.
func (j *jsonReader) element() error {
	if j.elements++; j.elements%workElements == 0 {
		return j.work.draw(1, LimitedJSON)
	}
	return nil
}

// container reads open, then members separated by commas, then close;
// member is called at the start of each one and must consume it.
func (j *jsonReader) container(open, close byte, member func(i int) error) error {
	if err := j.expect(open); err != nil {
		return err
	}
	if j.depth++; j.depth > maxDepth {
		return j.fail("nesting deeper than %d", maxDepth)
	}
	if err := j.element(); err != nil {
		j.depth--
		return err
	}
	defer func() { j.depth-- }()
	for i := 0; ; i++ {
		c, err := j.peek()
		if err != nil {
			return err
		}
		if c == close && i == 0 {
			_, err := j.readByte()
			return err
		}
		if i > 0 {
			sep, err := j.readByte()
			if err != nil {
				return err
			}
			if sep == close {
				return nil
			}
			if sep != ',' {
				return j.fail("expected ',' or %q", close)
			}
			if _, err := j.peek(); err != nil {
				return err
			}
		}
		if err := j.element(); err != nil {
			return err
		}
		if err := member(i); err != nil {
			return err
		}
	}
}

// str reads a string, handing its unescaped contents to sink (nil: skip)
// in pieces of at most a few KiB (a piece never splits an escape; it may
// split a UTF-8 sequence of the raw input). Runs of plain bytes are taken
// straight from the read buffer.
func (j *jsonReader) str(sink func([]byte) error) error {
	if err := j.expect('"'); err != nil {
		return err
	}
	j.u8n = 0
	buf := j.strBuf[:]
	out := buf[:0]
	flush := func() error {
		if len(out) == 0 || sink == nil {
			out = buf[:0]
			return nil
		}
		err := sink(out)
		out = buf[:0]
		return err
	}
	for {
		if j.r.Buffered() == 0 {
			if _, err := j.r.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					return j.fail("unexpected end of input")
				}
				return err
			}
		}
		chunk, _ := j.r.Peek(j.r.Buffered())
		plain, firstHigh := plainRun(chunk)
		if j.u8n > 0 && plain > 0 {
			firstHigh = 0
		}
		if firstHigh >= 0 && !j.noUTF8Check {
			if err := j.checkUTF8(chunk[firstHigh:plain]); err != nil {
				return err
			}
		}
		for done := 0; done < plain; {
			if len(out) == len(buf) {
				if err := flush(); err != nil {
					return err
				}
			}
			n := copy(out[len(out):cap(out)], chunk[done:plain])
			out = out[:len(out)+n]
			done += n
		}
		if err := j.consume(plain); err != nil {
			return err
		}
		if plain == len(chunk) {
			continue
		}
		if len(out) > len(buf)-8 {
			if err := flush(); err != nil {
				return err
			}
		}
		if j.u8n > 0 {
			return j.fail("invalid UTF-8 in string")
		}
		c, err := j.readByte()
		if err != nil {
			return err
		}
		switch {
		case c == '"':
			return flush()
		case c < 0x20:
			return j.fail("control character in string")
		}
		if out, err = j.escape(out); err != nil {
			return err
		}
	}
}

// plainRun is the length of the run of plain bytes chunk starts with (up
// to a quote, a backslash or a control character), and where its first
// non-ASCII byte is (-1: none). ASCII is stepped over eight bytes at a
// time; non-ASCII byte by byte, to be validated from its first byte on.
func plainRun(chunk []byte) (plain, firstHigh int) {
	firstHigh = -1
	for {
		plain += plainASCII(chunk[plain:])
		if plain == len(chunk) {
			return plain, firstHigh
		}
		c := chunk[plain]
		if c == '"' || c == '\\' || c < 0x20 {
			return plain, firstHigh
		}
		if c >= utf8.RuneSelf && firstHigh < 0 {
			firstHigh = plain
		}
		plain++
	}
}

// escapes are the one-letter escapes of JSON strings and what they stand for.
var escapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escape reads the escape after a backslash and appends what it stands for.
func (j *jsonReader) escape(out []byte) ([]byte, error) {
	e, err := j.readByte()
	if err != nil {
		return out, err
	}
	if c := escapes[e]; c != 0 {
		return append(out, c), nil
	}
	if e != 'u' {
		return out, j.fail("invalid escape")
	}
	r, err := j.hex4()
	if err != nil {
		return out, err
	}
	if utf16.IsSurrogate(r) {
		r = j.lowSurrogate(r)
	}
	return utf8.AppendRune(out, r), nil
}

// consume takes n bytes already in the read buffer.
func (j *jsonReader) consume(n int) error {
	if n == 0 {
		return nil
	}
	if j.capturing {
		b, _ := j.r.Peek(n)
		room := j.captureMax - len(j.capture)
		if n > room {
			b, j.overflow = b[:max(room, 0)], true
		}
		j.capture = append(j.capture, b...)
	}
	j.r.Discard(n)
	j.off += int64(n)
	if j.tee != nil && len(j.capture) >= teeFlush {
		return j.flushTee()
	}
	return nil
}

// teeFlush is how many captured bytes a tee is handed at a time.
const teeFlush = 16 << 10

func (j *jsonReader) flushTee() error {
	err := j.tee(j.capture)
	j.capture = j.capture[:0]
	return err
}

func (j *jsonReader) hex4() (rune, error) {
	var r rune
	for i := 0; i < 4; i++ {
		c, err := j.readByte()
		if err != nil {
			return 0, err
		}
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, j.fail("invalid \\u escape")
		}
		r = r<<4 | rune(c)
	}
	return r, nil
}

// lowSurrogate completes a surrogate pair when "\uDC00"… follows; a lone
// surrogate becomes U+FFFD, as encoding/json decodes it.
func (j *jsonReader) lowSurrogate(hi rune) rune {
	b, err := j.r.Peek(6)
	if err != nil || b[0] != '\\' || b[1] != 'u' {
		return utf8.RuneError
	}
	var lo rune
	for _, c := range b[2:] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return utf8.RuneError
		}
		lo = lo<<4 | rune(c)
	}
	r := utf16.DecodeRune(hi, lo)
	if r == utf8.RuneError {
		return r
	}
	for i := 0; i < 6; i++ {
		j.readByte()
	}
	return r
}

// stringValue reads a string of at most max bytes (longer: truncated).
func (j *jsonReader) stringValue(max int) (string, error) {
	var b []byte
	err := j.str(func(p []byte) error {
		if room := max - len(b); room > 0 {
			b = append(b, p[:min(room, len(p))]...)
		}
		return nil
	})
	return string(b), err
}

// kind reports the type of the next value: '"', '{', '[', 'n' (number),
// 't', 'f' or 'l' (null).
func (j *jsonReader) kind() (byte, error) {
	c, err := j.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == '"' || c == '{' || c == '[':
		return c, nil
	case c == '-' || c >= '0' && c <= '9':
		return 'n', nil
	case c == 't' || c == 'f':
		return c, nil
	case c == 'n':
		return 'l', nil
	}
	return 0, j.fail("unexpected character where a value should start")
}

// skip consumes one value of any type, validating it.
func (j *jsonReader) skip() error {
	k, err := j.kind()
	if err != nil {
		return err
	}
	switch k {
	case '"':
		return j.str(nil)
	case '{':
		return j.object(func([]byte) error { return j.skip() })
	case '[':
		return j.array(func(int) error { return j.skip() })
	case 'n':
		return j.number()
	case 't':
		return j.literal("true")
	case 'f':
		return j.literal("false")
	default:
		return j.literal("null")
	}
}

func (j *jsonReader) literal(s string) error {
	for i := 0; i < len(s); i++ {
		c, err := j.readByte()
		if err != nil {
			return err
		}
		if c != s[i] {
			return j.fail("invalid literal")
		}
	}
	return nil
}

// number consumes a number (RFC 8259 grammar).
func (j *jsonReader) number() error {
	digits := func() (int, error) {
		n := 0
		for {
			b, err := j.r.Peek(1)
			if err != nil || b[0] < '0' || b[0] > '9' {
				return n, nil
			}
			j.readByte()
			n++
		}
	}
	if b, _ := j.r.Peek(1); len(b) == 1 && b[0] == '-' {
		j.readByte()
	}
	b, err := j.r.Peek(1)
	if err != nil {
		return j.fail("invalid number")
	}
	if b[0] == '0' {
		j.readByte()
	} else if n, _ := digits(); n == 0 {
		return j.fail("invalid number")
	}
	if b, _ := j.r.Peek(1); len(b) == 1 && b[0] == '.' {
		j.readByte()
		if n, _ := digits(); n == 0 {
			return j.fail("invalid number")
		}
	}
	if b, _ := j.r.Peek(1); len(b) == 1 && (b[0] == 'e' || b[0] == 'E') {
		j.readByte()
		if b, _ := j.r.Peek(1); len(b) == 1 && (b[0] == '+' || b[0] == '-') {
			j.readByte()
		}
		if n, _ := digits(); n == 0 {
			return j.fail("invalid number")
		}
	}
	return nil
}
