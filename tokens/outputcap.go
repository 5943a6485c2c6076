package tokens

import (
	"bytes"
	"errors"
	"math"
	"strconv"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/jsonscan"
)

// OutputCapMembers are the members by which the OpenAI and Anthropic APIs
// take a request's output cap (SPEC §8).
var OutputCapMembers = [...]string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

// ErrNotEditable says a body cannot have its output cap written: it is not
// one JSON object.
var ErrNotEditable = errors.New("the body is not one JSON object")

// Editable reports whether CapOutput can edit b: one JSON object with
// nothing after it but space.
func Editable(b []byte) bool {
	o := jsonscan.OpenObject(b, 0)
	for _, ok := o.Next(); ok; _, ok = o.Next() {
	}
	c := o.Closing()
	return c >= 0 && jsonscan.SkipSpace(b, c+1) == len(b)
}

// CapOutput returns b with an output cap of at most limit (≥ 1), in a new
// buffer (b may be read-only), and whether it changed anything. Every
// top-level member whose name reads as one of OutputCapMembers (after
// unescaping and Unicode simple folding, as the most lenient upstream
// reads names, SPEC §4.6) keeps its value only when that is a JSON number
// from 1 to limit; any other value — larger, below 1, fractional below 1,
// out of range, a string, null, an object — has its bytes replaced by
// limit's digits. With no such member, add (one of OutputCapMembers) is
// appended as the object's last member. Every other byte is b's. Members
// of nested objects are not caps (the APIs read the top level only) and
// stay as sent.
func CapOutput(b []byte, add string, limit int64) ([]byte, bool, error) {
	o := jsonscan.OpenObject(b, 0)
	var edits []Edit
	members := 0
	found := false
	digits := []byte(strconv.FormatInt(limit, 10))
	for m, ok := o.Next(); ok; m, ok = o.Next() {
		members++
		if m.Truncated || !isCapMember(m.Key) {
			continue
		}
		found = true
		if !capWithin(b[m.VS:m.VE], limit) {
			edits = append(edits, Edit{Start: int64(m.VS), End: int64(m.VE), Text: digits})
		}
	}
	closing := o.Closing()
	if closing < 0 || jsonscan.SkipSpace(b, closing+1) != len(b) {
		return nil, false, ErrNotEditable
	}
	if !found {
		text := make([]byte, 0, len(add)+len(digits)+4)
		if members > 0 {
			text = append(text, ',')
		}
		text = strconv.AppendQuote(text, add)
		text = append(append(text, ':'), digits...)
		edits = append(edits, Edit{Start: int64(closing), End: int64(closing), Text: text})
	}
	if len(edits) == 0 {
		return b, false, nil
	}
	var out bytes.Buffer
	at := int64(0)
	for _, e := range edits {
		out.Write(b[at:e.Start])
		out.Write(e.Text)
		at = e.End
	}
	out.Write(b[at:])
	return out.Bytes(), true, nil
}

// isCapMember reports whether a raw member name reads as an output cap.
func isCapMember(raw []byte) bool {
	for _, name := range OutputCapMembers {
		if foldedIs(raw, name) {
			return true
		}
	}
	return false
}

// capWithin reports whether v is a JSON number from 1 to limit: every
// reading of it (an integer, a float rounded either way) is then a cap of
// at most limit that produces something.
func capWithin(v []byte, limit int64) bool {
	if !isJSONNumber(v) {
		return false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return err == nil && !math.IsNaN(f) && f >= 1 && f <= float64(limit)
}

// isJSONNumber reports whether v is exactly a JSON number (RFC 8259).
func isJSONNumber(v []byte) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i, n = i+1, n+1
		}
		return n
	}
	if i < len(v) && v[i] == '-' {
		i++
	}
	if i < len(v) && v[i] == '0' {
		i++
	} else if digits() == 0 {
		return false
	}
	if i < len(v) && v[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(v)
}
