package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

// Edit replaces the bytes [Start, End) of a body by Text (Start == End
// inserts). The edits of one body are sorted and never overlap.
type Edit struct {
	Start, End int64
	Text       []byte
}

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
func IncludeUsage(b []byte) ([]Edit, error) {
	o := jsonscan.OpenObject(b, 0)
	if o.Bad {
		return nil, errNotObject
	}
	var edits []Edit
	var last []byte // the last stream_options value
	members := 0
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		members++
		if foldedIs(m.Key, "stream_options") {
			edits = append(edits, Edit{Start: int64(m.VS), End: int64(m.VE)})
			last = b[m.VS:m.VE]
		}
	}
	closing := o.Closing()
	if closing < 0 {
		return nil, errScan
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
	if len(value) > 0 && value[0] == '{' {
		o := jsonscan.OpenObject(value, 0)
		for m, ok := o.Next(); ok; m, ok = o.Next() {
			if foldedIs(m.Key, "include_usage") {
				continue
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, value[m.KS:m.VE]...)
		}
		if o.Closing() < 0 {
			return nil, errScan
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

var errScan = errors.New("malformed JSON")

// Edited returns body with edits applied, as a reader, and its new size;
// the unchanged parts are read from body, not copied.
func Edited(body []byte, edits []Edit) (io.Reader, int64) {
	var parts []io.Reader
	at, n := int64(0), int64(len(body))
	for _, e := range edits {
		parts = append(parts, bytes.NewReader(body[at:e.Start]), bytes.NewReader(e.Text))
		n += int64(len(e.Text)) - (e.End - e.Start)
		at = e.End
	}
	parts = append(parts, bytes.NewReader(body[at:]))
	return io.MultiReader(parts...), n
}
