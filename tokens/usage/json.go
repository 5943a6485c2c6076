package usage

import "bytes"

// The JSON here is read in place, without decoding: the functions below
// find where values begin and end and hand out sub-slices of the input.
// Each is total: any input (truncated, invalid, not JSON at all) gives an
// answer, never a panic, and every loop advances, so none can hang. They
// trust the upstream's format where it costs nothing to (a "]" closing a
// "{" is taken as a close) and fail closed where it matters: a value that
// does not end is reported as truncated.

// structural marks the bytes skipContainer stops at.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// literalEnd marks the bytes that end a number or a literal.
var literalEnd = [256]bool{
	' ': true, '\t': true, '\n': true, '\r': true,
	',': true, ':': true, '"': true,
	'{': true, '}': true, '[': true, ']': true,
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipSpace returns the index of the first non-space byte at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// spaceBefore returns the index just after the last non-space byte before i.
func spaceBefore(b []byte, i int) int {
	for i > 0 && isSpace(b[i-1]) {
		i--
	}
	return i
}

// skipString returns the index after the string that opens at b[i] ('"'),
// or len(b) and false when it does not end.
func skipString(b []byte, i int) (int, bool) {
	from := i + 1
	for {
		j := bytes.IndexByte(b[from:], '"')
		if j < 0 {
			return len(b), false
		}
		j += from
		k := j
		for k > from && b[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			return j + 1, true
		}
		from = j + 1
	}
}

// skipContainer returns the index after the object or array that opens at
// b[i], or len(b) and false when it does not end.
func skipContainer(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		for i < len(b) && !structural[b[i]] {
			i++
		}
		if i == len(b) {
			break
		}
		switch b[i] {
		case '"':
			end, ok := skipString(b, i)
			if !ok {
				return len(b), false
			}
			i = end
			continue
		case '{', '[':
			depth++
		default: // '}', ']'
			depth--
			if depth == 0 {
				return i + 1, true
			}
		}
		i++
	}
	return len(b), false
}

// skipValue returns the index after the value that starts at b[i]. A value
// that does not end gives len(b) and false; a byte that cannot start a
// value gives i and false.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		return skipContainer(b, i)
	}
	j := i
	for j < len(b) && !literalEnd[b[j]] {
		j++
	}
	return j, j > i
}

// member is one member of an object: the key starts (with its quote) at
// b[ks], the value is b[vs:ve]; comma is the index of the comma before the
// key (-1 for the first member).
type member struct {
	key        []byte // the key without its quotes
	ks, vs, ve int
	comma      int
	truncated  bool // the value does not end within the input
}

// object walks the members of a JSON object in order.
type object struct {
	b       []byte
	i       int
	comma   int
	started bool
	end     bool // no more members
	bad     bool // malformed or truncated: the walk stopped early
}

// openObject starts a walk of the object whose '{' is the first non-space
// byte at or after i.
func openObject(b []byte, i int) object {
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != '{' {
		return object{end: true, bad: true}
	}
	return object{b: b, i: i + 1, comma: -1}
}

func (o *object) fail() {
	o.end, o.bad = true, true
}

// next returns the next member, or false at the end of the object or when
// the input is malformed (then o.bad is set). A value cut short by the end
// of the input is returned with truncated set, and the walk ends there.
func (o *object) next() (member, bool) {
	if o.end {
		return member{}, false
	}
	b := o.b
	i := skipSpace(b, o.i)
	if i >= len(b) {
		o.fail()
		return member{}, false
	}
	if o.started {
		switch b[i] {
		case '}':
			o.end, o.i = true, i+1
			return member{}, false
		case ',':
			o.comma = i
			i = skipSpace(b, i+1)
		default:
			o.fail()
			return member{}, false
		}
	} else {
		o.started = true
		if b[i] == '}' {
			o.end, o.i = true, i+1
			return member{}, false
		}
	}
	if i >= len(b) || b[i] != '"' {
		o.fail()
		return member{}, false
	}
	ke, ok := skipString(b, i)
	if !ok {
		o.fail()
		return member{}, false
	}
	j := skipSpace(b, ke)
	if j >= len(b) || b[j] != ':' {
		o.fail()
		return member{}, false
	}
	vs := skipSpace(b, j+1)
	ve, ok := skipValue(b, vs)
	m := member{key: b[i+1 : ke-1], ks: i, vs: vs, ve: ve, comma: o.comma}
	if !ok {
		o.fail()
		if ve == vs {
			return member{}, false
		}
		m.truncated = true
		return m, true
	}
	o.i = ve
	return m, true
}

// array walks the elements of a JSON array in order.
type array struct {
	b       []byte
	i       int
	started bool
	end     bool
}

// openArray starts a walk of the array that is v (a value as member gives
// it); anything else walks as an empty array.
func openArray(v []byte) array {
	if len(v) == 0 || v[0] != '[' {
		return array{end: true}
	}
	return array{b: v, i: 1}
}

// next returns the next element, possibly cut short by the end of the
// input (the walk ends after it), or false at the end.
func (a *array) next() ([]byte, bool) {
	if a.end {
		return nil, false
	}
	b := a.b
	i := skipSpace(b, a.i)
	if i >= len(b) {
		a.end = true
		return nil, false
	}
	if a.started {
		if b[i] != ',' {
			a.end = true
			return nil, false
		}
		i = skipSpace(b, i+1)
	} else {
		a.started = true
		if b[i] == ']' {
			a.end = true
			return nil, false
		}
	}
	e, ok := skipValue(b, i)
	if e == i {
		a.end = true
		return nil, false
	}
	if !ok {
		a.end = true
	}
	a.i = e
	return b[i:e], true
}

// lookup returns the value of the first member of the object v named key,
// or nil.
func lookup(v []byte, key string) []byte {
	o := openObject(v, 0)
	for m, ok := o.next(); ok; m, ok = o.next() {
		if string(m.key) == key {
			return v[m.vs:m.ve]
		}
	}
	return nil
}

// whole reports whether v is an object that ends where v does (not cut
// short by the end of the input).
func whole(v []byte) bool {
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	e, ok := skipContainer(v, 0)
	return ok && e == len(v)
}

// isNull reports whether the value v is absent or null.
func isNull(v []byte) bool {
	return len(v) == 0 || string(v) == "null"
}

// isEmptyArray reports whether v is "[]", spaces inside allowed.
func isEmptyArray(v []byte) bool {
	return len(v) >= 2 && v[0] == '[' && skipSpace(v, 1) == len(v)-1 && v[len(v)-1] == ']'
}

// strIs reports whether the JSON value v is the string s (no escapes).
func strIs(v []byte, s string) bool {
	return len(v) == len(s)+2 && v[0] == '"' && v[len(v)-1] == '"' && string(v[1:len(v)-1]) == s
}

// unquoted returns the contents of the string value v when it has no
// escapes (event types and the like), else nil.
func unquoted(v []byte) []byte {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		return nil
	}
	return s
}

// maxTries bounds the occurrences of a key lastObject and lastNumber try,
// from the end: each try may scan to the end of b, and a tail made of
// nothing but the key must not cost its length squared.
const maxTries = 8

// lastObject finds, searching backwards, the last occurrence of the key
// (given with its quotes) followed by ':' and an object that ends within b,
// and returns that object (nil after maxTries occurrences). It is how a
// usage object is found in the tail of a body too large to keep whole.
func lastObject(b []byte, key string) []byte {
	end := len(b)
	for range maxTries {
		j := bytes.LastIndex(b[:end], []byte(key))
		if j < 0 {
			return nil
		}
		k := skipSpace(b, j+len(key))
		if k < len(b) && b[k] == ':' {
			k = skipSpace(b, k+1)
			if k < len(b) && b[k] == '{' {
				if e, ok := skipContainer(b, k); ok {
					return b[k:e]
				}
			}
		}
		end = j
	}
	return nil
}

// lastNumber is lastObject for a number value.
func lastNumber(b []byte, key string) []byte {
	end := len(b)
	for range maxTries {
		j := bytes.LastIndex(b[:end], []byte(key))
		if j < 0 {
			return nil
		}
		k := skipSpace(b, j+len(key))
		if k < len(b) && b[k] == ':' {
			k = skipSpace(b, k+1)
			if e, ok := skipValue(b, k); ok && e < len(b) && (b[k] == '-' || b[k] >= '0' && b[k] <= '9') {
				return b[k:e]
			}
		}
		end = j
	}
	return nil
}
