package pdf

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Fonts: how a shown string becomes text. Through the font's ToUnicode
// CMap when it has one, else through its simple encoding (WinAnsi,
// MacRoman or Standard, with /Differences read by glyph name), else one
// character a byte. A two-byte font without a CMap (Identity-H) shows its
// bytes one character each: at least as much text as it encodes.

type decoder interface {
	decode(dst, raw []byte) []byte
}

func (r *reader) fontDecoder(f dict) decoder {
	if s, ok := r.resolve(f["ToUnicode"]).(*stream); ok {
		for _, data := range r.decode(s, true) {
			if m := r.parseCMap(data); m != nil {
				return m
			}
		}
	}
	switch e := r.resolve(f["Encoding"]).(type) {
	case name:
		if strings.Contains(string(e), "UCS2") || strings.Contains(string(e), "UTF16") {
			return utf16{}
		}
		if t := baseEncoding(e); t != nil {
			return t
		}
	case dict:
		base, _ := e["BaseEncoding"].(name)
		t := baseEncoding(base)
		if t == nil {
			t = baseEncoding("")
		}
		diffs, _ := r.resolve(e["Differences"]).(array)
		code := 0
		for _, d := range diffs {
			if !r.b.step(1) {
				break
			}
			switch d := d.(type) {
			case int64:
				code = int(d)
			case name:
				if code >= 0 && code < 256 {
					if g := glyph(string(d)); g != "" {
						t[code] = g
					}
				}
				code++
			}
		}
		return t
	}
	return latin1{}
}

// table is a simple font's encoding: the text of each code.
type table [256]string

func (t *table) decode(dst, raw []byte) []byte {
	for _, c := range raw {
		dst = append(dst, t[c]...)
	}
	return dst
}

// baseEncoding returns a table of a named encoding ("" is Latin-1), or nil.
func baseEncoding(n name) *table {
	var high string // the runes of codes 0x80 to 0xff, 0 where Latin-1's
	var from rune
	switch n {
	case "WinAnsiEncoding":
		high, from = winAnsi, 0x80
	case "MacRomanEncoding":
		high, from = macRoman, 0x80
	case "StandardEncoding":
		high, from = standard, 0xa0
	case "":
	default:
		return nil
	}
	t := new(table)
	for c := range t {
		t[c] = string(rune(c))
	}
	i := from
	for _, x := range high {
		if x != 0 {
			t[i] = string(x)
		}
		i++
	}
	if n == "StandardEncoding" {
		t['\''], t['`'] = "’", "‘"
	}
	return t
}

const (
	winAnsi  = "€\x00‚ƒ„…†‡ˆ‰Š‹Œ\x00Ž\x00\x00‘’“”•–—˜™š›œ\x00žŸ"
	macRoman = "ÄÅÇÉÑÖÜáàâäãåçéèêëíìîïñóòôöõúùûü†°¢£§•¶ß®©™´¨≠ÆØ∞±≤≥¥µ∂∑∏π∫ªºΩæø¿¡¬√ƒ≈∆«»…\u00a0ÀÃÕŒœ–—“”‘’÷◊ÿŸ⁄€‹›ﬁﬂ‡·‚„‰ÂÊÁËÈÍÎÏÌÓÔ\uf8ffÒÚÛÙıˆ˜¯˘˙˚¸˝˛ˇ"
	standard = "\x00¡¢£⁄¥ƒ§¤'“«‹›ﬁﬂ\x00–†‡·\x00¶•‚„”»…‰\x00¿\x00`´ˆ˜¯˘˙¨\x00˚¸\x00˝˛ˇ—\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00Æ\x00ª\x00\x00\x00\x00ŁØŒº\x00\x00\x00\x00\x00æ\x00\x00\x00ı\x00\x00łøœß\x00\x00\x00\x00"
)

// glyph returns the text of a glyph name: from the table of common names,
// "uni" plus four hex digits and "u" plus four to six (uni0041, u1F600),
// one-letter names; a suffix (.sc) is
// dropped and a ligature (f_i) is its parts. An unknown name is "".
func glyph(n string) string {
	n, _, _ = strings.Cut(n, ".")
	if strings.Contains(n, "_") {
		var b strings.Builder
		for p := range strings.SplitSeq(n, "_") {
			b.WriteString(glyph(p))
		}
		return b.String()
	}
	if k := strings.Index(glyphNames, " "+n+":"); k >= 0 {
		r, _ := utf8.DecodeRuneInString(glyphNames[k+len(n)+2:])
		return string(r)
	}
	switch {
	case len(n) == 1 && (n[0] >= 'a' && n[0] <= 'z' || n[0] >= 'A' && n[0] <= 'Z'):
		return n
	case strings.HasPrefix(n, "uni") && len(n) >= 7 && (len(n)-3)%4 == 0:
		var b strings.Builder
		for i := 3; i < len(n); i += 4 {
			if v, err := strconv.ParseUint(n[i:i+4], 16, 16); err == nil {
				b.WriteRune(rune(v))
			}
		}
		return b.String()
	case n != "" && n[0] == 'u' && len(n) >= 5 && len(n) <= 7:
		if v, err := strconv.ParseUint(n[1:], 16, 32); err == nil && v <= utf8.MaxRune {
			return string(rune(v))
		}
	}
	return ""
}

type utf16 struct{}

func (utf16) decode(dst, raw []byte) []byte {
	for i := 0; i+1 < len(raw); i += 2 {
		u := rune(raw[i])<<8 | rune(raw[i+1])
		if u >= 0xd800 && u < 0xdc00 && i+3 < len(raw) {
			if v := rune(raw[i+2])<<8 | rune(raw[i+3]); v >= 0xdc00 && v < 0xe000 {
				u = 0x10000 + (u-0xd800)<<10 + v - 0xdc00
				i += 2
			}
		}
		dst = utf8.AppendRune(dst, u)
	}
	if len(raw)%2 == 1 {
		dst = utf8.AppendRune(dst, rune(raw[len(raw)-1]))
	}
	return dst
}

// A ToUnicode CMap: code space ranges, single codes (bfchar) and ranges
// (bfrange), at most maxCMapEntries of them.
type cmap struct {
	space  []codeRange
	chars  map[uint64]string // n<<32 | code → text
	ranges []bfRange         // sorted by n, lo
	minLen int
}

const maxCMapEntries = 1 << 16

type codeRange struct {
	lo, hi uint32
	n      int // bytes a code
}

type bfRange struct {
	codeRange
	dst  []byte   // UTF-16BE of the first code; its last unit counts up
	dsts [][]byte // or one destination a code
}

func (r *reader) parseCMap(data []byte) *cmap {
	m := &cmap{chars: map[uint64]string{}}
	l := &lexer{data: data, b: r.b}
	var ops []operand // strings, and arrays of strings in dsts
	var arrs [][][]byte
	entries := 0
	for entries < maxCMapEntries && !r.b.over {
		t := l.next()
		switch t.kind {
		case tEOF:
			return m.done()
		case tStr, tHex:
			ops = append(ops, operand{kind: tStr, str: l.str(t, nil)})
		case tArrL:
			var a [][]byte
			for u := l.next(); u.kind == tStr || u.kind == tHex; u = l.next() {
				a = append(a, l.str(u, nil))
			}
			arrs = append(arrs, a)
			ops = append(ops, operand{kind: tArrL, gaps: []int{len(arrs) - 1}})
		case tWord:
			entries += m.block(l.word(t), ops, arrs)
			ops, arrs = ops[:0], arrs[:0]
		}
		if !r.b.take(heldValue) {
			return nil
		}
	}
	return m.done()
}

// block takes the operands of an end…range or endbfchar operator.
func (m *cmap) block(op string, ops []operand, arrs [][][]byte) int {
	n := 0
	switch op {
	case "endcodespacerange":
		for k := 0; k+1 < len(ops); k += 2 {
			if lo, hi := ops[k].str, ops[k+1].str; len(lo) > 0 && len(lo) <= 4 && len(lo) == len(hi) {
				m.space = append(m.space, codeRange{be(lo), be(hi), len(lo)})
				n++
			}
		}
	case "endbfchar":
		for k := 0; k+1 < len(ops); k += 2 {
			if src := ops[k].str; len(src) > 0 && len(src) <= 4 {
				m.chars[uint64(len(src))<<32|uint64(be(src))] = string(utf16{}.decode(nil, ops[k+1].str))
				n++
			}
		}
	case "endbfrange":
		for k := 0; k+2 < len(ops); k += 3 {
			lo, hi := ops[k].str, ops[k+1].str
			if len(lo) == 0 || len(lo) > 4 || len(lo) != len(hi) || be(lo) > be(hi) {
				continue
			}
			b := bfRange{codeRange: codeRange{be(lo), be(hi), len(lo)}, dst: ops[k+2].str}
			if ops[k+2].kind == tArrL {
				b.dsts = arrs[ops[k+2].gaps[0]]
			}
			m.ranges = append(m.ranges, b)
			n++
		}
	}
	return n
}

func (m *cmap) done() *cmap {
	if len(m.chars) == 0 && len(m.ranges) == 0 {
		return nil
	}
	slices.SortFunc(m.ranges, func(a, b bfRange) int {
		if a.n != b.n {
			return a.n - b.n
		}
		return int(int64(a.lo) - int64(b.lo))
	})
	m.minLen = 4
	for _, s := range m.space {
		m.minLen = min(m.minLen, s.n)
	}
	if len(m.space) == 0 {
		m.minLen = 2
		if len(m.ranges) > 0 {
			m.minLen = m.ranges[0].n
		}
		for k := range m.chars {
			m.minLen = int(k >> 32)
			break
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

func (m *cmap) decode(dst, raw []byte) []byte {
	for len(raw) > 0 {
		n := min(m.minLen, len(raw))
	space:
		for k := 1; k <= 4 && k <= len(raw); k++ {
			for _, s := range m.space {
				if c := be(raw[:k]); s.n == k && s.lo <= c && c <= s.hi {
					n = k
					break space
				}
			}
		}
		code := be(raw[:n])
		raw = raw[n:]
		if s, ok := m.chars[uint64(n)<<32|uint64(code)]; ok {
			dst = append(dst, s...)
			continue
		}
		dst = m.lookup(dst, code, n)
	}
	return dst
}

func (m *cmap) lookup(dst []byte, code uint32, n int) []byte {
	k, _ := slices.BinarySearchFunc(m.ranges, codeRange{code, code, n}, func(a bfRange, t codeRange) int {
		if a.n != t.n {
			return a.n - t.n
		}
		if a.lo <= t.lo {
			return -1
		}
		return 1
	})
	// The ranges starting at or below code; they may overlap: look back a little.
	for k, steps := k-1, 0; k >= 0 && steps < 8 && m.ranges[k].n == n; k, steps = k-1, steps+1 {
		b := m.ranges[k]
		if code > b.hi {
			continue
		}
		off := code - b.lo
		if b.dsts != nil {
			if int(off) < len(b.dsts) {
				return utf16{}.decode(dst, b.dsts[off])
			}
			break
		}
		if len(b.dst) < 2 {
			break
		}
		u := b.dst[len(b.dst)-2:]
		dst = utf16{}.decode(dst, b.dst[:len(b.dst)-2])
		return utf8.AppendRune(dst, rune(uint16(u[0])<<8|uint16(u[1])+uint16(off)))
	}
	return utf8.AppendRune(dst, utf8.RuneError)
}

const glyphNames = " " +
	"space:  exclam:! quotedbl:\" numbersign:# dollar:$ percent:% ampersand:& " +
	"quotesingle:' parenleft:( parenright:) asterisk:* plus:+ comma:, " +
	"hyphen:- period:. slash:/ zero:0 one:1 two:2 three:3 four:4 five:5 " +
	"six:6 seven:7 eight:8 nine:9 colon:: semicolon:; less:< equal:= " +
	"greater:> question:? at:@ bracketleft:[ backslash:\\ bracketright:] " +
	"asciicircum:^ underscore:_ grave:` braceleft:{ bar:| braceright:} " +
	"asciitilde:~ nbspace:  exclamdown:¡ cent:¢ sterling:£ currency:¤ yen:¥ " +
	"brokenbar:¦ section:§ dieresis:¨ copyright:© ordfeminine:ª " +
	"guillemotleft:« logicalnot:¬ softhyphen:­ registered:® macron:¯ " +
	"degree:° plusminus:± twosuperior:² threesuperior:³ acute:´ mu:µ " +
	"paragraph:¶ periodcentered:· cedilla:¸ onesuperior:¹ ordmasculine:º " +
	"guillemotright:» onequarter:¼ onehalf:½ threequarters:¾ questiondown:¿ " +
	"Agrave:À Aacute:Á Acircumflex:Â Atilde:Ã Adieresis:Ä Aring:Å AE:Æ " +
	"Ccedilla:Ç Egrave:È Eacute:É Ecircumflex:Ê Edieresis:Ë Igrave:Ì " +
	"Iacute:Í Icircumflex:Î Idieresis:Ï Eth:Ð Ntilde:Ñ Ograve:Ò Oacute:Ó " +
	"Ocircumflex:Ô Otilde:Õ Odieresis:Ö multiply:× Oslash:Ø Ugrave:Ù " +
	"Uacute:Ú Ucircumflex:Û Udieresis:Ü Yacute:Ý Thorn:Þ germandbls:ß " +
	"agrave:à aacute:á acircumflex:â atilde:ã adieresis:ä aring:å ae:æ " +
	"ccedilla:ç egrave:è eacute:é ecircumflex:ê edieresis:ë igrave:ì " +
	"iacute:í icircumflex:î idieresis:ï eth:ð ntilde:ñ ograve:ò oacute:ó " +
	"ocircumflex:ô otilde:õ odieresis:ö divide:÷ oslash:ø ugrave:ù uacute:ú " +
	"ucircumflex:û udieresis:ü yacute:ý thorn:þ ydieresis:ÿ quoteright:’ " +
	"quoteleft:‘ quotedblleft:“ quotedblright:” quotesinglbase:‚ " +
	"quotedblbase:„ bullet:• endash:– emdash:— ellipsis:… dagger:† " +
	"daggerdbl:‡ perthousand:‰ trademark:™ Euro:€ florin:ƒ OE:Œ oe:œ " +
	"Scaron:Š scaron:š Zcaron:Ž zcaron:ž Ydieresis:Ÿ Lslash:Ł lslash:ł " +
	"dotlessi:ı fraction:⁄ guilsinglleft:‹ guilsinglright:› circumflex:ˆ " +
	"tilde:˜ minus:− fi:ﬁ fl:ﬂ ff:ﬀ ffi:ﬃ ffl:ﬄ breve:˘ dotaccent:˙ ring:˚ " +
	"hungarumlaut:˝ ogonek:˛ caron:ˇ notequal:≠ lessequal:≤ greaterequal:≥ " +
	"infinity:∞ partialdiff:∂ summation:∑ product:∏ pi:π integral:∫ Omega:Ω " +
	"radical:√ approxequal:≈ Delta:∆ lozenge:◊ arrowright:→ arrowleft:← " +
	"checkmark:✓ Gamma:Γ Theta:Θ Lambda:Λ Sigma:Σ Phi:Φ Psi:Ψ alpha:α beta:β " +
	"gamma:γ delta:δ epsilon:ε theta:θ sigma:σ phi:φ omega:ω afii61352:№ " +
	"lambda:λ "
