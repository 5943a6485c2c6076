// Package jsonscan reads JSON in place: it finds where values begin and end
// in a byte slice and hands out sub-slices, without decoding or
// allocating. Every function is total: any input (truncated, invalid, not
// JSON at all) gives an answer, never a panic, and every loop advances, so
// none can hang; none recurses, so no nesting is too deep. It trusts its
// input's format where that costs nothing (a "]" closing a "{" is taken as
// a close) and fails closed where it matters: a value that does not end is
// reported as truncated.
//
// It is the one JSON scanner of the module: the usage reader walks
// upstream answers with it, the request editor (include_usage) finds the
// members it rewrites with it, and the token counter's reader validates
// request bodies on its lexing (SkipSpace, AppendEscape) as it walks them.
package jsonscan

import "bytes"

// structural marks the bytes SkipContainer stops at.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// literalEnd marks the bytes that end a number or a literal.
var literalEnd = [256]bool{
	' ': true, '\t': true, '\n': true, '\r': true,
	',': true, ':': true, '"': true,
	'{': true, '}': true, '[': true, ']': true,
}

func IsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipSpace returns the index of the first non-space byte at or after i.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && IsSpace(b[i]) {
		i++
	}
	return i
}

// SpaceBefore returns the index just after the last non-space byte before i.
func SpaceBefore(b []byte, i int) int {
	for i > 0 && IsSpace(b[i-1]) {
		i--
	}
	return i
}

// SkipString returns the index after the string that opens at b[i] ('"'),
// or len(b) and false when it does not end.
func SkipString(b []byte, i int) (int, bool) {
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

// SkipContainer returns the index after the object or array that opens at
// b[i], or len(b) and false when it does not end.
func SkipContainer(b []byte, i int) (int, bool) {
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
			end, ok := SkipString(b, i)
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

// SkipValue returns the index after the value that starts at b[i]. A value
// that does not end gives len(b) and false; a byte that cannot start a
// value gives i and false.
func SkipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		return SkipContainer(b, i)
	}
	j := i
	for j < len(b) && !literalEnd[b[j]] {
		j++
	}
	return j, j > i
}

// Member is one member of an object: the key starts (with its quote) at
// b[ks], the value is b[vs:ve]; comma is the index of the comma before the
// key (-1 for the first member).
type Member struct {
	Key        []byte // the key without its quotes
	KS, VS, VE int
	Comma      int
	Truncated  bool // the value does not end within the input
}

// Object walks the members of a JSON object in order.
type Object struct {
	b       []byte
	i       int
	comma   int
	started bool
	end     bool // no more members
	Bad     bool // malformed or truncated: the walk stopped early
}

// Closing is the index of the object's closing brace once Next has
// reported its end (Bad unset); -1 before.
func (o *Object) Closing() int {
	if !o.end || o.Bad {
		return -1
	}
	return o.i - 1
}

// OpenObject starts a walk of the object whose '{' is the first non-space
// byte at or after i.
func OpenObject(b []byte, i int) Object {
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != '{' {
		return Object{end: true, Bad: true}
	}
	return Object{b: b, i: i + 1, comma: -1}
}

func (o *Object) fail() {
	o.end, o.Bad = true, true
}

// Next returns the next member, or false at the end of the object or when
// the input is malformed (then o.Bad is set). A value cut short by the end
// of the input is returned with truncated set, and the walk ends there.
func (o *Object) Next() (Member, bool) {
	if o.end {
		return Member{}, false
	}
	b := o.b
	i := SkipSpace(b, o.i)
	if i >= len(b) {
		o.fail()
		return Member{}, false
	}
	if o.started {
		switch b[i] {
		case '}':
			o.end, o.i = true, i+1
			return Member{}, false
		case ',':
			o.comma = i
			i = SkipSpace(b, i+1)
		default:
			o.fail()
			return Member{}, false
		}
	} else {
		o.started = true
		if b[i] == '}' {
			o.end, o.i = true, i+1
			return Member{}, false
		}
	}
	if i >= len(b) || b[i] != '"' {
		o.fail()
		return Member{}, false
	}
	ke, ok := SkipString(b, i)
	if !ok {
		o.fail()
		return Member{}, false
	}
	j := SkipSpace(b, ke)
	if j >= len(b) || b[j] != ':' {
		o.fail()
		return Member{}, false
	}
	vs := SkipSpace(b, j+1)
	ve, ok := SkipValue(b, vs)
	m := Member{Key: b[i+1 : ke-1], KS: i, VS: vs, VE: ve, Comma: o.comma}
	if !ok {
		o.fail()
		if ve == vs {
			return Member{}, false
		}
		m.Truncated = true
		return m, true
	}
	o.i = ve
	return m, true
}

// Array walks the elements of a JSON array in order.
type Array struct {
	b       []byte
	i       int
	started bool
	end     bool
}

// OpenArray starts a walk of the array that is v (a value as Member gives
// it); anything else walks as an empty array.
func OpenArray(v []byte) Array {
	if len(v) == 0 || v[0] != '[' {
		return Array{end: true}
	}
	return Array{b: v, i: 1}
}

// Next returns the next element, possibly cut short by the end of the
// input (the walk ends after it), or false at the end.
func (a *Array) Next() ([]byte, bool) {
	if a.end {
		return nil, false
	}
	b := a.b
	i := SkipSpace(b, a.i)
	if i >= len(b) {
		a.end = true
		return nil, false
	}
	if a.started {
		if b[i] != ',' {
			a.end = true
			return nil, false
		}
		i = SkipSpace(b, i+1)
	} else {
		a.started = true
		if b[i] == ']' {
			a.end = true
			return nil, false
		}
	}
	e, ok := SkipValue(b, i)
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

// Lookup returns the value of the first Member of the object v named key,
// or nil.
func Lookup(v []byte, key string) []byte {
	o := OpenObject(v, 0)
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		if string(m.Key) == key {
			return v[m.VS:m.VE]
		}
	}
	return nil
}

// Whole reports whether v is an object that ends where v does (not cut
// short by the end of the input).
func Whole(v []byte) bool {
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	e, ok := SkipContainer(v, 0)
	return ok && e == len(v)
}

// IsNull reports whether the value v is absent or null.
func IsNull(v []byte) bool {
	return len(v) == 0 || string(v) == "null"
}

// IsEmptyArray reports whether v is "[]", spaces inside allowed.
func IsEmptyArray(v []byte) bool {
	return len(v) >= 2 && v[0] == '[' && SkipSpace(v, 1) == len(v)-1 && v[len(v)-1] == ']'
}

// Unquoted returns the contents of the string value v when it has no
// escapes (event types and the like), else nil.
func Unquoted(v []byte) []byte {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		return nil
	}
	return s
}

// maxTries bounds the occurrences of a key LastObject and LastNumber try,
// from the end: each try may scan to the end of b, and a tail made of
// nothing but the key must not cost its length squared.
const maxTries = 8

// LastObject finds, searching backwards, the last occurrence of the key
// (given with its quotes) followed by ':' and an object that ends within b,
// and returns that object (nil after maxTries occurrences). It is how a
// usage object is found in the tail of a body too large to keep whole.
func LastObject(b []byte, key string) []byte {
	return lastValue(b, key, func(k int) (int, bool) {
		if b[k] != '{' {
			return 0, false
		}
		return SkipContainer(b, k)
	})
}

// LastNumber is LastObject for a number value.
func LastNumber(b []byte, key string) []byte {
	return lastValue(b, key, func(k int) (int, bool) {
		e, ok := SkipValue(b, k)
		return e, ok && e < len(b) && (b[k] == '-' || b[k] >= '0' && b[k] <= '9')
	})
}

// lastValue is the last value after key and ':' that value (given the
// index where it starts, within b) accepts, returning where it ends.
func lastValue(b []byte, key string, value func(k int) (int, bool)) []byte {
	end := len(b)
	for range maxTries {
		j := bytes.LastIndex(b[:end], []byte(key))
		if j < 0 {
			return nil
		}
		k := SkipSpace(b, j+len(key))
		if k < len(b) && b[k] == ':' {
			if k = SkipSpace(b, k+1); k < len(b) {
				if e, ok := value(k); ok {
					return b[k:e]
				}
			}
		}
		end = j
	}
	return nil
}
