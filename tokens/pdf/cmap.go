package pdf

import (
	"sort"
	"unicode/utf8"
)

// A ToUnicode CMap, read by this package: the library's reader
// (page.go readCmap) runs the CMap through its PostScript interpreter, whose
// stack grows with the stream, and decodes every code with a linear search
// of all mappings. This one keeps at most maxCMapEntries mappings and looks
// codes up in a map and a sorted range list.

const maxCMapEntries = 1 << 16

type codeRange struct {
	lo, hi uint32
	n      int // code length in bytes
}

type bfRange struct {
	codeRange
	dst  []uint16   // UTF-16 of the first code; the last unit counts up
	dsts [][]uint16 // or one destination per code
}

type cmapDecoder struct {
	space  []codeRange
	chars  map[uint64]string // n<<32|code → text
	ranges []bfRange         // sorted by n, lo
	minLen int
}

func codeKey(code uint32, n int) uint64 { return uint64(n)<<32 | uint64(code) }

// parseCMap reads a ToUnicode CMap; it returns nil when data maps nothing.
func parseCMap(data []byte, b *budget) *cmapDecoder {
	m := &cmapDecoder{chars: map[uint64]string{}}
	type item struct {
		s   []byte
		arr [][]byte
		isA bool
	}
	var stack []item
	var inArr bool
	var arr [][]byte
	entries := 0
	i := 0
	for entries < maxCMapEntries {
		if b.tick() != nil {
			return nil
		}
		i = skipSpace(data, i)
		if i >= len(data) {
			break
		}
		switch c := data[i]; {
		case c == '<' && i+1 < len(data) && data[i+1] == '<':
			i += 2
		case c == '>' && i+1 < len(data) && data[i+1] == '>':
			i += 2
		case c == '<':
			var s []byte
			s, i = hexString(data, i+1, nil)
			if inArr {
				arr = append(arr, s)
			} else {
				stack = append(stack, item{s: s})
			}
		case c == '(':
			var s []byte
			s, i = literalString(data, i+1, nil)
			if inArr {
				arr = append(arr, s)
			} else {
				stack = append(stack, item{s: s})
			}
		case c == '[':
			i++
			inArr, arr = true, nil
		case c == ']':
			i++
			if inArr {
				stack = append(stack, item{arr: arr, isA: true})
				inArr, arr = false, nil
			}
		default:
			j := i + 1
			for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
				j++
			}
			tok := string(data[i:j])
			if c == '/' {
				for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
					j++
				}
			}
			i = j
			switch tok {
			case "endcodespacerange":
				for k := 0; k+1 < len(stack); k += 2 {
					lo, hi := stack[k].s, stack[k+1].s
					if len(lo) == 0 || len(lo) > 4 || len(lo) != len(hi) {
						continue
					}
					m.space = append(m.space, codeRange{be(lo), be(hi), len(lo)})
					entries++
				}
			case "endbfchar":
				for k := 0; k+1 < len(stack); k += 2 {
					src, dst := stack[k].s, stack[k+1].s
					if len(src) == 0 || len(src) > 4 {
						continue
					}
					m.chars[codeKey(be(src), len(src))] = string(appendUTF16(nil, dst))
					entries++
				}
			case "endbfrange":
				for k := 0; k+2 < len(stack); k += 3 {
					lo, hi, dst := stack[k].s, stack[k+1].s, stack[k+2]
					if len(lo) == 0 || len(lo) > 4 || len(lo) != len(hi) || be(lo) > be(hi) {
						continue
					}
					r := bfRange{codeRange: codeRange{be(lo), be(hi), len(lo)}}
					if dst.isA {
						for _, d := range dst.arr {
							r.dsts = append(r.dsts, utf16Units(d))
						}
					} else {
						r.dst = utf16Units(dst.s)
					}
					m.ranges = append(m.ranges, r)
					entries++
				}
			}
			stack = stack[:0]
		}
		if len(stack) > 3*maxCMapEntries {
			stack = stack[:0]
		}
	}
	if len(m.chars) == 0 && len(m.ranges) == 0 {
		return nil
	}
	sort.Slice(m.ranges, func(a, b int) bool {
		if m.ranges[a].n != m.ranges[b].n {
			return m.ranges[a].n < m.ranges[b].n
		}
		return m.ranges[a].lo < m.ranges[b].lo
	})
	m.minLen = 4
	for _, s := range m.space {
		m.minLen = min(m.minLen, s.n)
	}
	if len(m.space) == 0 {
		// No code space: take the length of the mapped codes.
		m.minLen = 2
		for k := range m.chars {
			m.minLen = int(k >> 32)
			break
		}
		if len(m.chars) == 0 && len(m.ranges) > 0 {
			m.minLen = m.ranges[0].n
		}
	}
	return m
}

func be(b []byte) uint32 {
	var x uint32
	for _, c := range b {
		x = x<<8 | uint32(c)
	}
	return x
}

func utf16Units(b []byte) []uint16 {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		u = append(u, uint16(b[i])<<8|uint16(b[i+1]))
	}
	if len(b)%2 == 1 {
		u = append(u, uint16(b[len(b)-1]))
	}
	return u
}

// codeLen returns the length of the code at the start of raw.
func (m *cmapDecoder) codeLen(raw []byte) int {
	for n := 1; n <= 4 && n <= len(raw); n++ {
		code := be(raw[:n])
		for _, s := range m.space {
			if s.n == n && s.lo <= code && code <= s.hi {
				return n
			}
		}
	}
	return min(m.minLen, len(raw))
}

func (m *cmapDecoder) decode(dst, raw []byte) []byte {
	for len(raw) > 0 {
		n := m.codeLen(raw)
		code := be(raw[:n])
		raw = raw[n:]
		if s, ok := m.chars[codeKey(code, n)]; ok {
			dst = append(dst, s...)
			continue
		}
		dst = m.lookupRange(dst, code, n)
	}
	return dst
}

func (m *cmapDecoder) lookupRange(dst []byte, code uint32, n int) []byte {
	// The last range of length n starting at or below code.
	k := sort.Search(len(m.ranges), func(i int) bool {
		r := m.ranges[i]
		return r.n > n || r.n == n && r.lo > code
	}) - 1
	// Ranges may overlap: look back a little for one that holds code.
	for steps := 0; k >= 0 && steps < 8 && m.ranges[k].n == n; k, steps = k-1, steps+1 {
		r := m.ranges[k]
		if code > r.hi {
			continue
		}
		off := code - r.lo
		if r.dsts != nil {
			if int(off) < len(r.dsts) {
				return appendUnits(dst, r.dsts[off], 0)
			}
			break
		}
		return appendUnits(dst, r.dst, uint16(off))
	}
	return utf8.AppendRune(dst, utf8.RuneError)
}

func appendUnits(dst []byte, u []uint16, add uint16) []byte {
	if len(u) == 0 {
		return utf8.AppendRune(dst, utf8.RuneError)
	}
	for i := 0; i < len(u); i++ {
		x := rune(u[i])
		if i == len(u)-1 {
			x = rune(u[i] + add)
		}
		if x >= 0xd800 && x < 0xdc00 && i+1 < len(u) {
			y := rune(u[i+1])
			if i+1 == len(u)-1 {
				y = rune(u[i+1] + add)
			}
			if y >= 0xdc00 && y < 0xe000 {
				dst = utf8.AppendRune(dst, 0x10000+(x-0xd800)<<10+(y-0xdc00))
				i++
				continue
			}
		}
		dst = utf8.AppendRune(dst, x)
	}
	return dst
}

// expansion is the most UTF-16 units the CMap maps a code byte to, times
// 16: how much longer than its codes a string's text may be.
func (m *cmapDecoder) expansion() int {
	e := 0
	for k, s := range m.chars {
		e = max(e, 16*utf8.RuneCountInString(s)/max(1, int(k>>32)))
	}
	for _, r := range m.ranges {
		l := len(r.dst)
		for _, d := range r.dsts {
			l = max(l, len(d))
		}
		e = max(e, 16*l/max(1, r.n))
	}
	return e
}
