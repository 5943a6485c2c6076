package pdf

import (
	"bytes"
)

// The scan's fonts, and the names and references it counts pages by.

// cmaps returns the decoder the scan reads strings with. It knows no
// fonts: each string is read as bytes, and through each of the file's
// ToUnicode CMaps (the maxScanCMaps that expand a code the most), and the
// longest reading counts, so that a CMap mapping a code to many characters
// cannot hide them.
func (s *scan) cmaps(b *budget) decoder {
	var ms []*cmapDecoder
	var ex []int
	for _, st := range s.streams {
		if st.class != classText {
			continue
		}
		for _, v := range st.vars {
			if v.result == undecoded || !bytes.Contains(v.data, []byte("beginbf")) {
				continue
			}
			m := parseCMap(v.data, b)
			if m == nil {
				continue
			}
			e := m.expansion()
			if len(ms) < maxScanCMaps {
				ms, ex = append(ms, m), append(ex, e)
				continue
			}
			k := 0
			for j := range ex {
				if ex[j] < ex[k] {
					k = j
				}
			}
			if e > ex[k] {
				ms[k], ex[k] = m, e
			}
		}
	}
	if len(ms) == 0 {
		return rawDecoder{}
	}
	return &longestDecoder{cmaps: ms}
}

// scanFonts is the scan's resources: one decoder for every font, no forms
// (the scan reads every form as a stream of its own).
type scanFonts struct{ dec decoder }

func (f *scanFonts) font([]byte) decoder    { return f.dec }
func (f *scanFonts) form([]byte, int) error { return nil }

// longestDecoder reads a string as bytes and through each CMap, and keeps
// the longest reading.
type longestDecoder struct {
	cmaps []*cmapDecoder
	tmp   []byte
}

func (d *longestDecoder) decode(dst, raw []byte) []byte {
	start := len(dst)
	dst = rawDecoder{}.decode(dst, raw)
	for _, m := range d.cmaps {
		d.tmp = m.decode(d.tmp[:0], raw)
		if len(d.tmp) > len(dst)-start {
			dst = append(dst[:start], d.tmp...)
		}
	}
	return dst
}

// names is what scanNames finds: page dictionaries (/Type /Page) and the
// objects named as page contents (/Contents N G R, or an array of those).
type names struct {
	pages    int // /Type /Page dictionaries
	nodes    int // /Type /Pages dictionaries
	kids     int // references in /Kids arrays
	contents map[int]bool
}

func (n *names) add(m names) {
	n.pages += m.pages
	n.nodes += m.nodes
	n.kids += m.kids
	for k := range m.contents {
		n.contents[k] = true
	}
}

// pageCount is the number of pages a reader walking the page tree could
// find: at least the page dictionaries, and at least the references in Kids
// arrays that are not to Pages nodes (a tree may name one page many times).
func (n *names) pageCount() int {
	return max(1, n.pages, n.kids-max(0, n.nodes-1))
}

// scanNames reads the names of data, with #xx escapes read as a PDF reader
// does.
func scanNames(data []byte) names {
	n := names{contents: map[int]bool{}}
	prevType := false
	for i := 0; ; {
		k := bytes.IndexByte(data[i:], '/')
		if k < 0 {
			return n
		}
		j := i + k + 1
		e := j
		for e < len(data) && !isSpace(data[e]) && !isDelim(data[e]) {
			e++
		}
		name := data[j:e]
		if bytes.IndexByte(name, '#') >= 0 {
			name = unescapeName(name)
		}
		switch {
		case prevType && string(name) == "Page":
			n.pages++
		case prevType && string(name) == "Pages":
			n.nodes++
		case string(name) == "Contents" && len(n.contents) < maxStreams:
			refs(data[e:min(len(data), e+4096)], func(obj int) { n.contents[obj] = true })
		case string(name) == "Kids":
			e += refs(data[e:], func(int) { n.kids++ })
		}
		prevType = string(name) == "Type"
		i = max(e, j)
	}
}

// refs reads "N G R" or "[N G R …]" at the start of data, calling f with
// each object number; it returns the bytes it read.
func refs(data []byte, f func(obj int)) int {
	i := skipSpace(data, 0)
	inArray := i < len(data) && data[i] == '['
	if inArray {
		i++
	}
	for {
		var toks [3][]byte
		for t := range toks {
			i = skipSpace(data, i)
			j := i
			for j < len(data) && !isSpace(data[j]) && !isDelim(data[j]) {
				j++
			}
			toks[t], i = data[i:j], j
		}
		num, ok1 := number(toks[0])
		_, ok2 := number(toks[1])
		if !ok1 || !ok2 || string(toks[2]) != "R" {
			return i
		}
		f(int(num))
		if !inArray {
			return i
		}
	}
}

func unescapeName(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '#' && i+2 < len(b) && unhex(b[i+1]) >= 0 && unhex(b[i+2]) >= 0 {
			out = append(out, byte(unhex(b[i+1])<<4|unhex(b[i+2])))
			i += 2
			continue
		}
		out = append(out, b[i])
	}
	return out
}
