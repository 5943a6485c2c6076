package tokens

import "encoding/binary"

// The string scan of jsonReader: plain ASCII a word at a time.

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
