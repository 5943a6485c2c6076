package tokens

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

// jsonReader is a validating pull parser over a body held whole (in
// memory, or mapped from its spool file): it hands a string's contents
// out as sub-slices of the body (escapes decoded into a small buffer) and
// skips what it is not asked for, so it allocates nothing whatever the
// size of a value. encoding/json (and jsontext) would copy every string,
// base64 images included. Its lexing is jsonscan's, the scanner the usage
// reader and the include_usage editor walk with; what it adds is
// validation: a syntax error is an *InvalidError.
type jsonReader struct {
	b     []byte
	i     int // the next byte
	depth int
	// work, when set, is drawn on by every workElements-th container or
	// member read: tiny ones cost more to read than their bytes say.
	work     *work
	elements int
	// fullKeys makes object hand field the whole member name (in keyAcc),
	// not only its first 256 bytes: schemas, whose member names the model
	// reads, are counted name and all.
	fullKeys bool
	keyAcc   []byte
	// noUTF8Check skips validating strings as UTF-8: for a pass that only
	// looks for a member, followed by the count that validates what it
	// reads.
	noUTF8Check bool
	esc         [512]byte // decoded escapes on their way to a sink
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

// newJSONReader returns a reader of b.
func newJSONReader(b []byte) *jsonReader { return &jsonReader{b: b} }

func (j *jsonReader) fail(format string, args ...any) error {
	return &InvalidError{msg: fmt.Sprintf("invalid JSON at byte %d: ", j.i) + fmt.Sprintf(format, args...)}
}

func (j *jsonReader) errEnd() error { return j.fail("unexpected end of input") }

// peek skips whitespace and returns the next byte without consuming it.
func (j *jsonReader) peek() (byte, error) {
	if j.i = jsonscan.SkipSpace(j.b, j.i); j.i == len(j.b) {
		return 0, j.errEnd()
	}
	return j.b[j.i], nil
}

// end checks that only whitespace follows the top-level value.
func (j *jsonReader) end() error {
	if j.i = jsonscan.SkipSpace(j.b, j.i); j.i < len(j.b) {
		return j.fail("data after the top-level value")
	}
	return nil
}

func (j *jsonReader) expect(c byte) error {
	got, err := j.peek()
	if err != nil {
		return err
	}
	if got != c {
		return j.fail("expected %q", c)
	}
	j.i++
	return nil
}

// object reads an object; field is called for each key and must consume
// its value (with skip if it has no use for it).
func (j *jsonReader) object(field func(key []byte) error) error {
	var keyBuf [64]byte
	return j.container('{', '}', func(int) error {
		key := keyBuf[:0]
		if j.fullKeys {
			key = j.keyAcc[:0]
		}
		long := false
		err := j.str(func(p []byte) error {
			if !j.fullKeys && (long || len(key)+len(p) > 256) { // no key we look for, nor is its end:
				long, key = true, append(key[:0], 0xff) // it folds to U+FFFD, in no table
				return nil
			}
			key = append(key, p...)
			return nil
		})
		if j.fullKeys {
			j.keyAcc = key
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
	defer func() { j.depth-- }()
	if err := j.element(); err != nil {
		return err
	}
	for i := 0; ; i++ {
		c, err := j.peek()
		if err != nil {
			return err
		}
		switch {
		case c == close && i == 0:
			j.i++
			return nil
		case i > 0:
			j.i++
			if c == close {
				return nil
			}
			if c != ',' {
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
// in pieces: runs of plain bytes as they stand in the body, decoded
// escapes gathered in a small buffer. A sink must not keep a piece.
func (j *jsonReader) str(sink func([]byte) error) error {
	if err := j.expect('"'); err != nil {
		return err
	}
	out := j.esc[:0]
	for {
		start := j.i
		plain := plainRun(j.b[start:])
		if j.i += plain; j.i == len(j.b) {
			return j.errEnd()
		}
		if !j.noUTF8Check && !utf8.Valid(j.b[start:j.i]) {
			return j.fail("invalid UTF-8 in string")
		}
		if plain > 0 || len(out) > len(j.esc)-utf8.UTFMax {
			if err := j.hand(sink, out); err != nil {
				return err
			}
			out = j.esc[:0]
			if err := j.hand(sink, j.b[start:j.i]); err != nil {
				return err
			}
		}
		switch c := j.b[j.i]; {
		case c == '"':
			j.i++
			return j.hand(sink, out)
		case c < 0x20:
			return j.fail("control character in string")
		}
		var n int
		var ok bool
		if out, n, ok = jsonscan.AppendEscape(out, j.b[j.i:]); !ok {
			return j.fail("invalid escape")
		}
		j.i += n
	}
}

func (j *jsonReader) hand(sink func([]byte) error, p []byte) error {
	if sink == nil || len(p) == 0 {
		return nil
	}
	return sink(p)
}

// plainRun is the length of the run of plain bytes b starts with: up to
// a quote, a backslash or a control character. ASCII is stepped over
// eight bytes at a time.
func plainRun(b []byte) int {
	n := 0
	for {
		n += plainASCII(b[n:])
		if n == len(b) {
			return n
		}
		if c := b[n]; c == '"' || c == '\\' || c < 0x20 {
			return n
		}
		n++
	}
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
	case c == '"' || c == '{' || c == '[' || c == 't' || c == 'f':
		return c, nil
	case c == '-' || c >= '0' && c <= '9':
		return 'n', nil
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
	if len(j.b)-j.i < len(s) || string(j.b[j.i:j.i+len(s)]) != s {
		return j.fail("invalid literal")
	}
	j.i += len(s)
	return nil
}

// number consumes a number (RFC 8259 grammar).
func (j *jsonReader) number() error {
	b := j.b
	is := func(cs string) bool {
		if j.i < len(b) {
			for k := 0; k < len(cs); k++ {
				if b[j.i] == cs[k] {
					j.i++
					return true
				}
			}
		}
		return false
	}
	digits := func() bool {
		from := j.i
		for j.i < len(b) && b[j.i] >= '0' && b[j.i] <= '9' {
			j.i++
		}
		return j.i > from
	}
	is("-")
	if !is("0") && !digits() {
		return j.fail("invalid number")
	}
	if is(".") && !digits() {
		return j.fail("invalid number")
	}
	if is("eE") {
		is("+-")
		if !digits() {
			return j.fail("invalid number")
		}
	}
	return nil
}

// Readers of a whole value's raw JSON text, for members whose text is
// costed as a whole (schemas, tool arguments) or returned (key parts).

// rawValue consumes one value and returns its raw JSON text.
func (j *jsonReader) rawValue() ([]byte, error) {
	if _, err := j.peek(); err != nil {
		return nil, err
	}
	start := j.i
	err := j.skip()
	return j.b[start:j.i], err
}

// teeValue consumes one value and hands its raw JSON text to sink.
func (j *jsonReader) teeValue(sink func([]byte) error) error {
	raw, err := j.rawValue()
	if err != nil {
		return err
	}
	return j.hand(sink, raw)
}

// captureValue consumes one value and returns its raw JSON text; past max
// bytes it returns the first max bytes and errCaptureFull (the value is
// consumed either way).
func (j *jsonReader) captureValue(max int) ([]byte, error) {
	raw, err := j.rawValue()
	if err == nil && len(raw) > max {
		return raw[:max], errCaptureFull
	}
	return raw, err
}
