package jwtauth

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Claims are a verified token's claims. Numbers are json.Number, as written
// in the token; nested objects are map[string]any.
type Claims map[string]any

// Value returns a claim as a key-part value: a string as is, a number as
// written in the token (1000000 stays 1000000), a boolean as "true" or
// "false". name is first looked up as a top-level claim (names such as
// "https://example.com/plan" hold dots), else as a dotted path into nested
// objects ("org.plan"). An array, an object, null or a missing claim gives
// false.
func (c Claims) Value(name string) (string, bool) {
	if x, ok := c[name]; ok {
		return scalar(x)
	}
	if !strings.Contains(name, ".") {
		return "", false
	}
	var cur any = map[string]any(c)
	for part := range strings.SplitSeq(name, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return "", false
		}
		if cur, ok = obj[part]; !ok {
			return "", false
		}
	}
	return scalar(cur)
}

// Subject returns the claim named claim (as Value reads it) when it is not
// empty: the caller's identity.
func (c Claims) Subject(claim string) (string, bool) {
	s, ok := c.Value(claim)
	if !ok || s == "" {
		return "", false
	}
	return s, true
}

func scalar(x any) (string, bool) {
	switch v := x.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	case float64: // Claims built by hand rather than by Verify
		return strconv.FormatFloat(v, 'f', -1, 64), true
	}
	return "", false
}
