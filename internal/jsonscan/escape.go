package jsonscan

import (
	"unicode/utf16"
	"unicode/utf8"
)

// escapes are the one-letter escapes of JSON strings and what they stand for.
var escapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// AppendEscape decodes the escape that starts s (s[0] is the backslash),
// appends what it stands for to dst and returns the bytes it took. A
// surrogate pair takes both escapes; a lone surrogate is U+FFFD, as
// encoding/json decodes it. ok is false when s does not start one of
// JSON's escapes: a lenient reader keeps what was appended (the letter
// itself, or U+FFFD for a bad \u), a strict one refuses.
func AppendEscape(dst, s []byte) (out []byte, n int, ok bool) {
	if len(s) < 2 {
		return dst, len(s), false
	}
	if c := escapes[s[1]]; c != 0 {
		return append(dst, c), 2, true
	}
	if s[1] != 'u' {
		return append(dst, s[1]), 2, false
	}
	r, ok := hex4(s)
	if !ok {
		return utf8.AppendRune(dst, utf8.RuneError), 2, false
	}
	n = 6
	if utf16.IsSurrogate(r) {
		lo, ok := rune(0), false
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			lo, ok = hex4(s[6:])
		}
		if r = utf16.DecodeRune(r, lo); ok && r != utf8.RuneError {
			n = 12
		}
	}
	return utf8.AppendRune(dst, r), n, true
}

// hex4 reads the four hex digits after "\u" at the start of s.
func hex4(s []byte) (rune, bool) {
	if len(s) < 6 {
		return 0, false
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
