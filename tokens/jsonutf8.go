package tokens

import (
	"encoding/binary"
	"unicode/utf8"
)

// The string scan of jsonReader: plain ASCII a word at a time, and UTF-8
// validated only where a string holds other bytes.

// plainASCII returns how many bytes at the start of p are printable ASCII
// other than '"' and '\\', eight at a time: the common run of a string.
func plainASCII(p []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	n := 0
	for ; n+8 <= len(p); n += 8 {
		w := binary.LittleEndian.Uint64(p[n:])
		quote, backslash := w^(ones*'"'), w^(ones*'\\')
		special := (w-ones*0x20)&^w | (quote-ones)&^quote | (backslash-ones)&^backslash | w
		if special&highs != 0 {
			break
		}
	}
	return n
}

// checkUTF8 validates a run of plain string bytes as UTF-8, carrying a
// sequence cut at the run's end over to the next run (in j.u8). Bodies
// must be UTF-8 (RFC 8259 §8.1): an upstream decoding them otherwise could
// read text this reader never saw.
func (j *jsonReader) checkUTF8(p []byte) error {
	if j.u8n > 0 {
		need := seqLen(j.u8[0]) - j.u8n
		take := min(need, len(p))
		copy(j.u8[j.u8n:], p[:take])
		j.u8n += take
		p = p[take:]
		if take < need {
			return nil // still cut: the next run completes it
		}
		if !utf8.Valid(j.u8[:j.u8n]) {
			return j.fail("invalid UTF-8 in string")
		}
		j.u8n = 0
	}
	tail := 0
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax+1; i-- {
		if c := p[i]; c >= 0xC0 { // the last sequence's first byte
			if seqLen(c) > len(p)-i {
				tail = len(p) - i
			}
			break
		} else if c < 0x80 {
			break
		}
	}
	if !utf8.Valid(p[:len(p)-tail]) {
		return j.fail("invalid UTF-8 in string")
	}
	j.u8n = copy(j.u8[:], p[len(p)-tail:])
	return nil
}

// seqLen is the length of the UTF-8 sequence that c starts (1 for a byte
// that starts none: utf8.Valid rejects it).
func seqLen(c byte) int {
	switch {
	case c >= 0xC2 && c < 0xE0:
		return 2
	case c >= 0xE0 && c < 0xF0:
		return 3
	case c >= 0xF0 && c < 0xF5:
		return 4
	}
	return 1
}
