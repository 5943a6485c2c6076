package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// Edit replaces the bytes [Start, End) of a body by Text (Start == End
// inserts). The edits of one body are sorted and never overlap.
type Edit struct {
	Start, End int64
	Text       []byte
}

// maxEditedBody bounds the body IncludeUsage reads; a larger one is left
// as it is (its usage is then counted from the output, SPEC §8).
const maxEditedBody = 32 << 20

var errNotObject = errors.New("the body is not a JSON object")

// IncludeUsage returns the edits that make an OpenAI streaming request
// (chat or legacy completions) ask its upstream for usage
// (stream_options.include_usage = true), keeping every other member as
// sent. Every top-level stream_options member, in any spelling the
// upstream could read as one (SPEC §4.6), gets the same object value: the
// last copy's members (an object's; nothing of another value) without any
// include_usage, then "include_usage":true. Without one, the member is
// added before the closing brace. The body must be one JSON object (the
// token count has checked it); anything else is an error and the body is
// left as it is.
func IncludeUsage(body io.ReaderAt, size int64) ([]Edit, error) {
	if size > maxEditedBody {
		return nil, errors.New("the body is too large to edit")
	}
	b := make([]byte, size)
	if n, err := body.ReadAt(b, 0); int64(n) < size {
		return nil, err
	}
	s := scanner{b: b}
	s.space()
	if s.i >= len(b) || b[s.i] != '{' {
		return nil, errNotObject
	}
	var edits []Edit
	var last []byte // the last stream_options value
	members := 0
	closing, err := s.members(func(name []byte, vs, ve int) {
		members++
		if foldedIs(name, "stream_options") {
			edits = append(edits, Edit{Start: int64(vs), End: int64(ve)})
			last = b[vs:ve]
		}
	})
	if err != nil {
		return nil, err
	}
	value, err := withIncludeUsage(last)
	if err != nil {
		return nil, err
	}
	if len(edits) == 0 {
		text := []byte(`"stream_options":`)
		if members > 0 {
			text = append([]byte(","), text...)
		}
		return []Edit{{Start: int64(closing), End: int64(closing), Text: append(text, value...)}}, nil
	}
	for i := range edits {
		edits[i].Text = value
	}
	return edits, nil
}

// withIncludeUsage is value (a stream_options member's, nil when none)
// with include_usage true: an object keeps its other members as sent.
func withIncludeUsage(value []byte) ([]byte, error) {
	out := []byte{'{'}
	s := scanner{b: value}
	s.space()
	if s.i < len(value) && value[s.i] == '{' {
		_, err := s.members(func(name []byte, vs, ve int) {
			if foldedIs(name, "include_usage") {
				return
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, value[s.nameStart:ve]...)
		})
		if err != nil {
			return nil, err
		}
	}
	if len(out) > 1 {
		out = append(out, ',')
	}
	return append(out, `"include_usage":true}`...), nil
}

// foldedIs reports whether a raw member name (JSON string contents,
// escapes included) reads as want under §4.6's matching.
func foldedIs(raw []byte, want string) bool {
	var name string
	if err := json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &name); err != nil {
		return false
	}
	var buf [64]byte
	return string(fold([]byte(name), buf[:0])) == want
}

// scanner walks a JSON document that is already known to be valid enough,
// by byte offsets; it never allocates and fails on what it cannot read.
type scanner struct {
	b         []byte
	i         int
	nameStart int // the opening quote of the member being reported
}

var errScan = errors.New("malformed JSON")

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// members reads the object at s.i, calling f with each member's raw name
// and the offsets of its value, and returns the offset of the closing
// brace; s.i ends after it.
func (s *scanner) members(f func(name []byte, vs, ve int)) (int, error) {
	s.i++ // '{'
	for {
		s.space()
		if s.i >= len(s.b) {
			return 0, errScan
		}
		if s.b[s.i] == '}' {
			closing := s.i
			s.i++
			return closing, nil
		}
		if s.b[s.i] == ',' {
			s.i++
			s.space()
		}
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return 0, errScan
		}
		start := s.i
		if err := s.str(); err != nil {
			return 0, err
		}
		name := s.b[start+1 : s.i-1]
		s.space()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return 0, errScan
		}
		s.i++
		s.space()
		vs := s.i
		if err := s.value(0); err != nil {
			return 0, err
		}
		save := s.i
		s.nameStart = start
		f(name, vs, s.i)
		s.i = save
	}
}

// str skips the string at s.i (its opening quote).
func (s *scanner) str() error {
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++
		case '"':
			s.i++
			return nil
		}
	}
	return errScan
}

// value skips the value at s.i, nested at most maxDepth deep.
func (s *scanner) value(depth int) error {
	if depth > maxDepth || s.i >= len(s.b) {
		return errScan
	}
	switch s.b[s.i] {
	case '"':
		return s.str()
	case '{', '[':
		closeBy := byte('}')
		if s.b[s.i] == '[' {
			closeBy = ']'
		}
		s.i++
		for {
			s.space()
			if s.i >= len(s.b) {
				return errScan
			}
			switch c := s.b[s.i]; {
			case c == closeBy:
				s.i++
				return nil
			case c == ',' || c == ':':
				s.i++
			default:
				if err := s.value(depth + 1); err != nil {
					return err
				}
			}
		}
	}
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r', ':':
			if s.i == start {
				return errScan
			}
			return nil
		}
		s.i++
	}
	if s.i == start {
		return errScan
	}
	return nil
}

// Edited returns body with edits applied, as a reader, and its new size;
// the unchanged parts are read from body, not copied.
func Edited(body io.ReaderAt, size int64, edits []Edit) (io.Reader, int64) {
	var parts []io.Reader
	at, n := int64(0), size
	for _, e := range edits {
		parts = append(parts, io.NewSectionReader(body, at, e.Start-at), bytes.NewReader(e.Text))
		n += int64(len(e.Text)) - (e.End - e.Start)
		at = e.End
	}
	parts = append(parts, io.NewSectionReader(body, at, size-at))
	return io.MultiReader(parts...), n
}
