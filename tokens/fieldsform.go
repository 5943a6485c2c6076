package tokens

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"strings"
)

// Form fields as key parts: a multipart body's non-file parts, a
// URL-encoded body's fields. Names match exactly (forms are
// case-sensitive); values are taken as sent. A field sent twice is
// refused: the proxy cannot know which copy the upstream reads.

// setField records a form field's value, refusing a second copy.
func setField(names []string, vals []Value, name, s string) error {
	for i, n := range names {
		if n == name {
			if vals[i].Found {
				return duplicate(name)
			}
			vals[i] = Value{S: s, Found: true}
		}
	}
	return nil
}

func isName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// multipartFields reads a multipart body to its end: its model field (as
// multipartModel reads it, a second one refused as countMultipart refuses
// it) and the fields names. A part is a field's value unless Go's parser
// names a file in it: a part that other parsers read as a file but Go's as
// a value (filename="") is a copy of the field, so that an upstream of
// either kind cannot read a value the key did not.
func multipartFields(r io.Reader, boundary string, names []string, vals []Value, wk *work) (string, error) {
	mr, err := newMultipart(r, boundary)
	if err != nil {
		return "", err
	}
	var model string
	sawModel := false
	for {
		p, err := nextPart(mr, wk)
		if err == io.EOF {
			return model, nil
		}
		if err != nil {
			return "", err
		}
		name := p.FormName()
		isModel := !isFile(p) && isModelField(name)
		field := p.FileName() == "" && isName(names, name)
		if !isModel && !field {
			continue
		}
		if isModel && sawModel {
			return "", duplicate("model")
		}
		sawModel = sawModel || isModel
		var lr io.Reader = p
		if !field {
			lr = io.LimitReader(p, 256)
		}
		b, err := io.ReadAll(lr)
		if err != nil {
			return "", &InvalidError{msg: "invalid multipart body: truncated part"}
		}
		if isModel {
			model = strings.TrimSpace(string(b[:min(len(b), 256)]))
		}
		if field {
			if err := setField(names, vals, name, string(b)); err != nil {
				return "", err
			}
		}
	}
}

// readForm reads a URL-encoded form's model (when model) and its fields
// names. A form of up to maxParsedForm bytes is read into memory once for
// both; a larger one's model is not read (as its count never parses it)
// and its fields are found in a stream.
func readForm(r io.Reader, size int64, names []string, vals []Value, model bool) (string, error) {
	s := newFormScan(names, vals)
	if size > maxParsedForm {
		if len(names) == 0 {
			return "", nil
		}
		return "", s.stream(r)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	var m string
	if model {
		if m, err = formModel(b); err != nil {
			return "", err
		}
	}
	if len(names) > 0 {
		if err := s.feed(b); err != nil {
			return "", err
		}
		if err := s.end(); err != nil {
			return "", err
		}
	}
	return m, nil
}

// formScan finds fields in a URL-encoded form as Go's url.ParseQuery
// reads it (pairs cut at '&', name and value at the first '=', both
// percent-decoded), and refuses a field that another common reading
// would see differently: a pair holding a ';' (Go drops it, Python reads
// it into the value, older parsers cut there) or an invalid %-escape (Go
// drops the pair, Python keeps the escape as text) is refused when any
// piece of it names a requested field.
type formScan struct {
	names  []string
	vals   []Value
	maxKey int // longest raw name that can decode to a requested one
	// The piece being read: pairs are cut at '&', pieces at ';'.
	key     []byte
	long    bool // the piece's name outgrew maxKey
	inValue bool
	collect bool // the value is kept: the pair's first piece names a field
	// The pair being read.
	used   bool // the pair has a byte
	pieces int  // ';' seen
	match  int  // the field the first piece names, -1 if none
	other  int  // a field a later piece names, -1 if none
	rawKey []byte
	value  []byte
}

func newFormScan(names []string, vals []Value) *formScan {
	s := &formScan{names: names, vals: vals, match: -1, other: -1}
	for _, n := range names {
		s.maxKey = max(s.maxKey, 3*len(n))
	}
	return s
}

// stream scans a form read from r.
func (s *formScan) stream(r io.Reader) error {
	var buf [16 << 10]byte
	for {
		n, err := r.Read(buf[:])
		if n > 0 {
			if err := s.feed(buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return s.end()
		}
		if err != nil {
			return err
		}
	}
}

// feed scans the next bytes of the form.
func (s *formScan) feed(p []byte) error {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '&':
			s.endPiece()
			if err := s.endPair(); err != nil {
				return err
			}
		case c == ';':
			s.endPiece()
			s.used, s.pieces = true, s.pieces+1
		case c == '=' && !s.inValue:
			s.used = true
			s.endKey()
		case !s.inValue:
			s.used = true
			if len(s.key) < s.maxKey+1 {
				s.key = append(s.key, c)
			} else {
				s.long = true
			}
		default: // a value's run: kept or skipped up to the next separator
			s.used = true
			end := bytes.IndexAny(p[i:], "&;")
			if end < 0 {
				end = len(p) - i
			}
			if s.collect {
				s.value = append(s.value, p[i:i+end]...)
			}
			i += end - 1
		}
	}
	return nil
}

// end ends the form's last pair.
func (s *formScan) end() error {
	s.endPiece()
	return s.endPair()
}

// endKey ends a piece's name: does it decode to a requested field?
func (s *formScan) endKey() {
	s.inValue = true
	m := -1
	if !s.long && len(s.key) <= s.maxKey {
		var buf [64]byte
		name := lenientUnescape(s.key, buf[:0])
		for i, n := range s.names {
			if n == string(name) {
				m = i
				break
			}
		}
	}
	switch {
	case s.pieces == 0:
		s.match = m
		if m >= 0 {
			s.collect, s.rawKey = true, append(s.rawKey[:0], s.key...)
		}
	case m >= 0 && s.other < 0:
		s.other = m
	}
}

func (s *formScan) endPiece() {
	if !s.inValue {
		s.endKey() // a name without '=': its value is empty
	}
	s.key, s.long, s.inValue, s.collect = s.key[:0], false, false, false
}

func (s *formScan) endPair() error {
	used, match, other, pieces := s.used, s.match, s.other, s.pieces
	s.used, s.pieces, s.match, s.other = false, 0, -1, -1
	defer func() { s.value = s.value[:0] }()
	switch {
	case !used: // an empty pair ("a=1&&b=2"), which every parser skips
		return nil
	case match >= 0 && pieces > 0:
		return ambiguousField(s.names[match])
	case other >= 0:
		return ambiguousField(s.names[other])
	case match < 0:
		return nil
	}
	k, kerr := url.QueryUnescape(string(s.rawKey))
	v, verr := url.QueryUnescape(string(s.value))
	if kerr != nil || verr != nil || k != s.names[match] {
		return ambiguousField(s.names[match])
	}
	return setField(s.names, s.vals, k, v)
}

func ambiguousField(name string) error {
	return &InvalidError{msg: "ambiguous form field \"" + name + "\"", final: true}
}

// lenientUnescape decodes a form name as the most lenient parsers do:
// '+' is a space, a valid %-escape its byte, anything else itself.
func lenientUnescape(b, out []byte) []byte {
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '+':
			out = append(out, ' ')
		case c == '%' && i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]):
			out = append(out, unhex(b[i+1])<<4|unhex(b[i+2]))
			i += 2
		default:
			out = append(out, c)
		}
	}
	return out
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
