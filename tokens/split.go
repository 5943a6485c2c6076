package tokens

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers below cut text into the pieces tiktoken's regular
// expressions would, so that each piece can be byte-pair encoded on its
// own. They are written by hand, not run through a regexp engine, because
// the patterns need look-ahead and backtracking, which Go's RE2 lacks, and
// tiktoken-go's backtracking engine (regexp2) counts at about 4 MB/s with
// ~1500 allocations per KiB. Each function emulates the leftmost-first,
// greedy-with-backtracking semantics of its pattern alternative by
// alternative; tests compare them with tiktoken-go on fixed and fuzzed
// input.
//
// cl100k_base:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// o200k_base:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+

// runes is the text as code points; invalid UTF-8 reads as U+FFFD, as Go's
// []rune conversion (and so tiktoken-go) does.
type runes []rune

func isL(r rune) bool {
	return r < utf8.RuneSelf && isASCIILetter(r) || r >= utf8.RuneSelf && unicode.IsLetter(r)
}
func isN(r rune) bool {
	return r >= '0' && r <= '9' || r >= utf8.RuneSelf && unicode.IsNumber(r)
}
func isASCIILetter(r rune) bool { return r|0x20 >= 'a' && r|0x20 <= 'z' }
func isNL(r rune) bool          { return r == '\r' || r == '\n' }

// isS is .NET's \s: [\f\n\r\t\v\x85\p{Z}], which is Unicode White_Space.
func isS(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || r >= '\t' && r <= '\r'
	}
	return unicode.IsSpace(r)
}

// isPrefix is [^\r\n\p{L}\p{N}].
func isPrefix(r rune) bool { return !isNL(r) && !isL(r) && !isN(r) }

// isPunct is [^\s\p{L}\p{N}].
func isPunct(r rune) bool { return !isS(r) && !isL(r) && !isN(r) }

// o200k's letter classes: "upper" [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
// "lower" [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func isUpperish(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 'A' && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func isLowerish(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 'a' && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

func lower(r rune) rune { return unicode.ToLower(r) }

// contraction returns the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at i, or 0.
func (t runes) contraction(i int) int {
	if i+1 >= len(t) || t[i] != '\'' {
		return 0
	}
	switch lower(t[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(t) && lower(t[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(t) && lower(t[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

func (t runes) run(i int, in func(rune) bool) int {
	for i < len(t) && in(t[i]) {
		i++
	}
	return i
}

// digits is \p{N}{1,3}.
func (t runes) digits(i int) int {
	j := i
	for j < len(t) && j-i < 3 && isN(t[j]) {
		j++
	}
	return j
}

// punct is  ?[^\s\p{L}\p{N}]+ followed by a run of tail characters.
func (t runes) punct(i int, tail func(rune) bool) int {
	j := i
	if j < len(t) && t[j] == ' ' && j+1 < len(t) && isPunct(t[j+1]) {
		j++
	}
	if j >= len(t) || !isPunct(t[j]) {
		return i
	}
	j = t.run(j, isPunct)
	return t.run(j, tail)
}

// whitespace tries \s*[\r\n]+, then \s+(?!\S), then \s+ at i.
func (t runes) whitespace(i int) int {
	j := t.run(i, isS)
	if j == i {
		return i
	}
	// \s*[\r\n]+: up to and including the last newline of the run.
	for k := j - 1; k >= i; k-- {
		if isNL(t[k]) {
			return k + 1
		}
	}
	// \s+(?!\S): the run, less its last character when a non-space follows.
	if j == len(t) {
		return j
	}
	if j-1 > i {
		return j - 1
	}
	return j // \s+
}

func (t runes) nextCL100K(i int) int {
	if n := t.contraction(i); n > 0 {
		return i + n
	}
	if isPrefix(t[i]) && i+1 < len(t) && isL(t[i+1]) {
		return t.run(i+1, isL)
	}
	if isL(t[i]) {
		return t.run(i, isL)
	}
	if isN(t[i]) {
		return t.digits(i)
	}
	if j := t.punct(i, isNL); j > i {
		return j
	}
	if j := t.whitespace(i); j > i {
		return j
	}
	return i + 1 // unreachable: every rune is a letter, number, space or other
}

// o200kLetters matches an o200k letter alternative from s (after an
// optional prefix): upperFirst selects [U]+[L]* over [U]*[L]+. It returns
// the end, or -1.
func (t runes) o200kLetters(s int, upperFirst bool) int {
	u := t.run(s, isUpperish)
	var end int
	if upperFirst {
		if u == s {
			return -1
		}
		end = t.run(u, isLowerish)
	} else {
		// [U]* is greedy; give characters back until [L]+ can start.
		end = -1
		for k := u; k >= s; k-- {
			if k < len(t) && isLowerish(t[k]) {
				end = t.run(k, isLowerish)
				break
			}
		}
		if end < 0 {
			return -1
		}
	}
	return end + t.contraction(end)
}

func (t runes) nextO200K(i int) int {
	for _, upperFirst := range [2]bool{false, true} {
		if isPrefix(t[i]) && i+1 < len(t) {
			if j := t.o200kLetters(i+1, upperFirst); j > 0 {
				return j
			}
		}
		if j := t.o200kLetters(i, upperFirst); j > 0 {
			return j
		}
	}
	if isN(t[i]) {
		return t.digits(i)
	}
	if j := t.punct(i, func(r rune) bool { return isNL(r) || r == '/' }); j > i {
		return j
	}
	if j := t.whitespace(i); j > i {
		return j
	}
	return i + 1
}
