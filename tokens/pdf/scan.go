package pdf

import (
	"bytes"
	"sort"
)

// The scan. It runs on every input, before the library: it finds every
// stream in the raw bytes (every `stream` keyword, as a lenient reader
// recovering a broken file would), decodes each one that could hold text
// under the shared budget, and keeps what it decoded. This is where a
// decompression bomb is caught wherever it sits (page content, an object
// stream, an object nothing refers to). When the library cannot read the
// file, the scan's streams are the fallback: their text-showing operators
// are read without fonts, and the streams it cannot decode are counted in
// Result.Unread.

type streamClass int

const (
	classText    streamClass = iota // may hold text: content, forms, anything unknown
	classObjects                    // an object stream (page dictionaries may be inside)
	classXRef                       // a cross-reference stream
	classSkip                       // images, font programs, metadata, attachments: never text
)

type rawStream struct {
	start, end int // the encoded data: data[start:end]
	obj        int // its object number, or -1
	class      streamClass
	result     decodeResult
	decoded    []byte
}

type scan struct {
	data      []byte
	streams   []rawStream
	rest      int // bytes after the last stream kept, past maxStreams
	encrypted bool
	header    bool // %PDF- in the first 1024 bytes
}

// maxStreams bounds the streams the scan keeps (some 70 bytes each); the
// bytes after the last one kept count as unread.
const maxStreams = 1 << 17

// maxDictScan bounds how far back from a stream keyword its dictionary is
// looked for; all those looks together cover at most 8 times the file.
const maxDictScan = 64 << 10

func scanFile(data []byte, b *budget) (*scan, error) {
	s := &scan{data: data}
	s.header = bytes.Contains(data[:min(len(data), 1024)], []byte("%PDF-"))
	s.encrypted = bytes.Contains(data, []byte("/Encrypt"))
	work := 8*len(data) + maxDictScan
	var inf inflaters
	var ends []int // every endstream
	for i := 0; ; {
		k := bytes.Index(data[i:], []byte("endstream"))
		if k < 0 {
			break
		}
		ends = append(ends, i+k)
		i += k + 9
	}
	// Stream keywords are looked for everywhere, inside other streams'
	// data too: a stream whose /Length lies, or that lacks its endstream,
	// must not hide the next one.
	for from := 0; from < len(data); {
		if err := b.tick(); err != nil {
			return nil, err
		}
		k := bytes.Index(data[from:], []byte("stream"))
		if k < 0 {
			break
		}
		p := from + k
		from = p + 6
		if p > 0 && !isSpace(data[p-1]) && !isDelim(data[p-1]) {
			continue
		}
		if p+6 >= len(data) || data[p+6] != '\r' && data[p+6] != '\n' {
			continue
		}
		start := p + 7
		if data[p+6] == '\r' && start < len(data) && data[start] == '\n' {
			start++
		}
		if len(s.streams) >= maxStreams {
			s.rest = len(data) - p
			break
		}
		var hdr dict
		obj := -1
		if work > 0 {
			var spent, k int
			hdr, k, spent = streamDict(data, p, start)
			work -= spent
			if hdr != nil {
				obj = objNumBefore(data, k)
			}
		}
		st := rawStream{start: start, end: streamEnd(data, start, hdr, ends), obj: obj}
		st.class = classify(hdr)
		if st.class != classSkip {
			chain := scanFilters(hdr, data[start:st.end])
			out, res, err := lenientChain(data[start:st.end], chain, b, &inf)
			if err != nil {
				return nil, err
			}
			st.result, st.decoded = res, out
			if st.class == classXRef {
				st.decoded = nil
			}
			if res == imageData {
				st.class = classSkip
				st.decoded = nil
			}
		}
		s.streams = append(s.streams, st)
	}
	return s, b.check()
}

// streamDict finds the dictionary of the stream whose keyword is at p and
// whose data starts at start: back to the `<<` that balances the `>>` before
// the keyword, then parsed forward with the mirror lexer, which must arrive
// at the same data. It returns nil when it cannot, where the dictionary
// starts, and the bytes it looked at.
func streamDict(data []byte, p, start int) (dict, int, int) {
	j := p
	for j > 0 && isSpace(data[j-1]) {
		j--
	}
	if j < 2 || data[j-1] != '>' || data[j-2] != '>' {
		return nil, 0, p - j
	}
	lo := max(0, j-maxDictScan)
	depth := 0
	k := j
	for k-2 >= lo {
		switch {
		case data[k-1] == '>' && data[k-2] == '>':
			depth++
			k -= 2
		case data[k-1] == '<' && data[k-2] == '<':
			depth--
			k -= 2
			if depth == 0 {
				// The dictionary ends before start: read no further.
				lx := newLexer(data[:min(len(data), start+1)], k)
				s, err := parse(func() streamObj {
					st, ok := lx.readObject().(streamObj)
					if !ok {
						lx.fail()
					}
					return st
				})
				if err != nil || int(s.offset) != start {
					return nil, 0, p - k
				}
				return s.hdr, k, p - k
			}
		default:
			k--
		}
	}
	return nil, 0, p - k
}

// objNumBefore reads the "N G obj" before position k, or returns -1.
func objNumBefore(data []byte, k int) int {
	j := k
	for j > 0 && isSpace(data[j-1]) {
		j--
	}
	if j < 3 || string(data[j-3:j]) != "obj" {
		return -1
	}
	nums := [2]int{}
	j -= 3
	for n := 1; n >= 0; n-- {
		for j > 0 && isSpace(data[j-1]) {
			j--
		}
		e := j
		for j > 0 && isDigit(data[j-1]) && e-j < 10 {
			j--
		}
		if j == e {
			return -1
		}
		v, _ := number(data[j:e])
		nums[n] = int(v)
	}
	return nums[0]
}

// streamEnd finds where a stream's data ends: at /Length when `endstream`
// follows it there, else before the next `endstream`, else at the end.
func streamEnd(data []byte, start int, hdr dict, ends []int) int {
	if n, ok := hdr["Length"].(int64); ok && n >= 0 && n <= int64(len(data)-start) {
		e := start + int(n)
		rest := data[e:]
		i := 0
		for i < len(rest) && i < 4 && isSpace(rest[i]) {
			i++
		}
		if bytes.HasPrefix(rest[i:], []byte("endstream")) {
			return e
		}
	}
	k := sort.SearchInts(ends, start)
	if k == len(ends) {
		return len(data)
	}
	e := ends[k]
	if e > start && data[e-1] == '\n' {
		e--
	}
	if e > start && data[e-1] == '\r' {
		e--
	}
	return e
}

func classify(hdr dict) streamClass {
	if hdr == nil {
		return classText
	}
	typ, _ := hdr["Type"].(pdfName)
	sub, _ := hdr["Subtype"].(pdfName)
	switch {
	case typ == "XRef":
		return classXRef
	case typ == "ObjStm":
		return classObjects
	case typ == "Metadata", typ == "EmbeddedFile", sub == "Image",
		sub == "Type1C", sub == "CIDFontType0C", sub == "OpenType":
		return classSkip
	}
	for _, k := range []pdfName{"Length1", "Length2", "Length3"} {
		if hdr[k] != nil {
			return classSkip // an embedded font program
		}
	}
	return classText
}

// scanFilters reads a stream's filter chain from its dictionary; without a
// dictionary, or with filters given indirectly, zlib data is inflated.
func scanFilters(hdr dict, raw []byte) []filter {
	switch f := hdr["Filter"].(type) {
	case pdfName:
		return []filter{{name: string(f)}}
	case array:
		var chain []filter
		for _, e := range f {
			n, ok := e.(pdfName)
			if !ok {
				return guessFilters(raw)
			}
			chain = append(chain, filter{name: string(n)})
		}
		return chain
	case nil:
		if hdr != nil {
			return nil
		}
	}
	return guessFilters(raw)
}

func guessFilters(raw []byte) []filter {
	if len(raw) >= 2 && raw[0]&0x0f == 8 && (uint16(raw[0])<<8|uint16(raw[1]))%31 == 0 {
		return []filter{{name: "FlateDecode"}}
	}
	return nil
}

// fallback costs the file from the scan alone: the text operators of
// every decoded stream, and the size of every stream it could not decode.
func (s *scan) fallback(b *budget, out *textOut) (Result, error) {
	var res Result
	names := scanNames(s.data)
	for _, st := range s.streams {
		if st.class == classObjects && st.result != undecoded {
			names.add(scanNames(st.decoded))
		}
	}
	var inf inflaters
	for i := range s.streams {
		st := &s.streams[i]
		if st.class == classSkip && st.obj >= 0 && names.contents[st.obj] {
			// A page's content dressed as an image, a font or metadata:
			// a reader that renders the page reads it as content.
			out, r, err := lenientChain(s.data[st.start:st.end], scanFilters(nil, s.data[st.start:st.end]), b, &inf)
			if err != nil {
				return res, err
			}
			st.class, st.result, st.decoded = classText, r, out
		}
		if st.class != classText {
			continue
		}
		if st.result == undecoded {
			res.Unread += int64(st.end - st.start)
			continue
		}
		if s.encrypted || st.result == damaged {
			// Damaged, or probably ciphertext: its size counts, and any
			// text it shows (the file may only claim to be encrypted) too.
			res.Unread += int64(st.end - st.start)
		}
		if err := newInterp(b, out, nil, 0).run(st.decoded); err != nil {
			return res, err
		}
		out.separate('\n')
	}
	if err := out.flush(); err != nil {
		return res, err
	}
	res.Unread += int64(s.rest)
	res.Pages = names.pageCount()
	if out.n == 0 && res.Unread == 0 {
		res.Unread = int64(len(s.data))
	}
	return res, nil
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
