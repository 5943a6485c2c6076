package jwtauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// A token is read the way the most lenient common library reads it, so
// that every spelling a library accepts as a token is that token here too
// (SPEC §4.1). What the libraries accept:
//
//   - PyJWT splits at the last dot (the signature) and the first dot (the
//     header): the payload may hold dots. It pads each segment and decodes
//     it with urlsafe_b64decode, which takes both base64 alphabets, skips
//     any other character (spaces, newlines, dots, …) and stops at "="
//     once that "=" completes a quantum; an earlier "=" is skipped.
//   - jose splits into exactly three segments. On Node it decodes with
//     Buffer.from(s, "base64"), which takes both alphabets, skips any other
//     character and stops at the first "="; elsewhere with atob or
//     Uint8Array.fromBase64, after removing whitespace.
//   - golang-jwt splits into exactly three segments and decodes with
//     RawURLEncoding (URLEncoding after padding with WithPaddingAllowed),
//     which skips \r and \n; without WithStrictDecoding, spare bits of the
//     last character are ignored.
//
// Every library checks the signature over the header and payload segments
// exactly as sent. Whenever golang-jwt or jose succeed, their reading is
// PyJWT's and Node's; so a segment has at most two readings, PyJWT's and
// Node's, and they differ only when an "=" stands before other base64
// characters.

// compact is a token split and decoded.
type compact struct {
	signed          string // header "." payload as sent: what the signature covers
	header, payload []byte
	sigs            [2][]byte // the signature as PyJWT and as Node read it; often the same
}

// readCompact splits token as PyJWT does and decodes its segments. A
// header or payload that the two readings decode differently is refused:
// which claims a library sees would depend on the library.
func readCompact(token string) (compact, bool) {
	last := strings.LastIndexByte(token, '.')
	if last < 0 {
		return compact{}, false
	}
	first := strings.IndexByte(token[:last], '.')
	if first < 0 {
		return compact{}, false
	}
	c := compact{signed: token[:last]}
	var ok bool
	if c.header, ok = decodeOne(token[:first]); !ok {
		return compact{}, false
	}
	if c.payload, ok = decodeOne(token[first+1 : last]); !ok {
		return compact{}, false
	}
	c.sigs[0], c.sigs[1] = decodeSegment(token[last+1:])
	return c, true
}

// decodeOne is a segment's bytes when both readings agree.
func decodeOne(seg string) ([]byte, bool) {
	py, node := decodeSegment(seg)
	return py, bytes.Equal(py, node)
}

// decodeSegment decodes a base64 segment as PyJWT and as Node read it:
// characters of either alphabet are data, any other character is skipped;
// Node stops at the first "=", PyJWT at an "=" that completes a quantum
// (two or three data characters, then "=" up to four). A lone last
// character is dropped and spare bits are ignored, as Node does.
func decodeSegment(seg string) (py, node []byte) {
	if canonical(seg) { // the common case, read the same by every library
		b, err := base64.RawURLEncoding.DecodeString(seg)
		if err == nil {
			return b, b
		}
	}
	vals := make([]byte, 0, len(seg)) // 6-bit values of the data characters
	nodeEnd := -1                     // data characters before the first "="
	quad, pads := 0, 0
	for i := 0; i < len(seg); i++ {
		ch := seg[i]
		if ch == '=' {
			if nodeEnd < 0 {
				nodeEnd = len(vals)
			}
			if quad >= 2 {
				pads++
				if quad+pads >= 4 {
					break
				}
			}
			continue
		}
		v, ok := sextet(ch)
		if !ok {
			continue
		}
		vals = append(vals, v)
		quad = (quad + 1) % 4
		pads = 0
	}
	if nodeEnd < 0 {
		nodeEnd = len(vals)
	}
	py = pack(vals)
	if nodeEnd == len(vals) {
		return py, py
	}
	return py, pack(vals[:nodeEnd])
}

// canonical reports whether seg holds base64url characters only.
func canonical(seg string) bool {
	for i := 0; i < len(seg); i++ {
		if ch := seg[i]; ch == '+' || ch == '/' {
			return false
		} else if _, ok := sextet(ch); !ok {
			return false
		}
	}
	return true
}

// sextet is the value of a base64 character of either alphabet.
func sextet(ch byte) (byte, bool) {
	switch {
	case 'A' <= ch && ch <= 'Z':
		return ch - 'A', true
	case 'a' <= ch && ch <= 'z':
		return ch - 'a' + 26, true
	case '0' <= ch && ch <= '9':
		return ch - '0' + 52, true
	case ch == '+' || ch == '-':
		return 62, true
	case ch == '/' || ch == '_':
		return 63, true
	}
	return 0, false
}

// pack turns 6-bit values into bytes; spare bits are dropped.
func pack(vals []byte) []byte {
	out := make([]byte, 0, len(vals)*3/4)
	var acc uint32
	bits := 0
	for _, v := range vals {
		acc = acc<<6 | uint32(v)
		bits += 6
		if bits >= 8 {
			bits -= 8
			out = append(out, byte(acc>>bits))
		}
	}
	return out
}

// Shaped reports whether token can be read as a JWT in compact JWS form by
// a common library: two dots at least, and a first segment that decodes
// (as any of them decodes it) to a JSON object. A shaped credential is
// meant as a JWT: when it does not verify, it is no credential (SPEC
// §7.5). An API key is not shaped; neither is a longer text than
// [MaxTokenBytes] whose header does not fit in it.
func Shaped(token string) bool {
	last := strings.LastIndexByte(token, '.')
	if last < 0 {
		return false
	}
	first := strings.IndexByte(token[:last], '.')
	if first < 0 || first > MaxTokenBytes {
		return false
	}
	py, node := decodeSegment(token[:first])
	return jsonObject(py) || jsonObject(node)
}

// jsonObject reports whether b begins with a JSON object (golang-jwt's
// decoder ignores what follows it).
func jsonObject(b []byte) bool {
	var m map[string]json.RawMessage
	return json.NewDecoder(bytes.NewReader(b)).Decode(&m) == nil && m != nil
}

// SignedPart is the part of a token its signature covers, header "."
// payload as sent: the same for every spelling of one token. "" when
// token has no two dots.
func SignedPart(token string) string {
	last := strings.LastIndexByte(token, '.')
	if last < 0 || strings.IndexByte(token[:last], '.') < 0 {
		return ""
	}
	return token[:last]
}
