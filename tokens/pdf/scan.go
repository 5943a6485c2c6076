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
// stream, an object nothing refers to). An encrypted file that opens with
// the empty password is decrypted here (crypt.go). When the library cannot
// read the file, the scan's streams are the fallback: their text-showing
// operators are read without fonts (each string as bytes and through each
// ToUnicode CMap of the file, the longest reading counting), and what it
// cannot decode is counted in Result.Unread.

type streamClass int

const (
	classText    streamClass = iota // may hold text: content, forms, anything unknown
	classObjects                    // an object stream (page dictionaries may be inside)
	classXRef                       // a cross-reference stream
	classSkip                       // images, font programs, metadata, attachments: never text
)

type rawStream struct {
	start, end int // the encoded data: data[start:end]
	obj, gen   int // its object number and generation, or -1
	class      streamClass
	chains     [][]filter // the filter chains readers may apply (streamChains)
	refHdr     dict       // the filter keys of the dictionary, when they hold references
	n, first   int        // an object stream's /N and /First
	// vars are the decodings of the stream (one per chain; of its
	// plaintext, when the file is encrypted and the stream was decrypted);
	// alt are decodings read for their text only (those of the ciphertext
	// of a decrypted stream, in case a reader takes the file as plain).
	vars, alt []variant
	// undecryptable: the file opened, but the stream could not be tied to
	// an object number, so not decrypted.
	undecryptable bool
}

type scan struct {
	data      []byte
	streams   []rawStream
	rest      int // bytes after the last stream kept, past maxStreams
	encrypted bool
	handlers  []*secHandler // the keys that open an encrypted file (crypt.go)
	xrefDicts []dict        // the dictionaries of cross-reference streams, for crypt.go
	header    bool          // %PDF- in the first 1024 bytes
}

// locked reports whether the file is encrypted and the empty password
// does not open it: no reader can read it without the password.
func (s *scan) locked() bool { return s.encrypted && len(s.handlers) == 0 }

// maxStreams bounds the streams the scan keeps (some 150 bytes each); the
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
		obj, gen := -1, -1
		if work > 0 {
			var spent, k int
			hdr, k, spent = streamDict(data, p, start)
			work -= spent
			if hdr != nil {
				obj, gen = objNumBefore(data, k)
			}
		}
		st := rawStream{start: start, end: streamEnd(data, start, hdr, ends), obj: obj, gen: gen}
		st.class = classify(hdr)
		st.chains = streamChains(hdr, data[start:st.end])
		if fk := filterKeys(hdr); hasRef(fk, 0) {
			st.refHdr = fk
		}
		switch st.class {
		case classObjects:
			n, _ := hdr["N"].(int64)
			first, _ := hdr["First"].(int64)
			st.n, st.first = int(min(max(n, 0), 1<<20)), int(min(max(first, 0), int64(len(data))))
		case classXRef:
			if len(s.xrefDicts) >= maxTrailers {
				s.xrefDicts = s.xrefDicts[1:]
			}
			s.xrefDicts = append(s.xrefDicts, hdr)
		}
		s.streams = append(s.streams, st)
	}
	// Every stream that could hold text is decoded as it is stored:
	// object streams first, so that the filters and parameters other
	// streams give by reference can be found in them too.
	var inf inflaters
	var x *objIndex
	for pass := 0; pass < 2; pass++ {
		for i := range s.streams {
			st := &s.streams[i]
			if st.class == classSkip || (st.class == classObjects) != (pass == 0) {
				continue
			}
			if st.refHdr != nil && pass == 1 {
				if x == nil {
					x = newObjIndex(s, b)
				}
				st.chains = streamChains(resolveRefs(st.refHdr, x, 0).(dict), data[st.start:st.end])
			}
			vars, err := decodeChains(data[st.start:st.end], st.chains, b, &inf)
			if err != nil {
				return nil, err
			}
			st.vars = vars
			if allImages(vars) {
				st.class, st.vars = classSkip, nil
			}
		}
	}
	// An encrypted file that opens with the empty password is decrypted,
	// and every stream decoded again from its plaintext.
	if err := s.openEncryption(b); err != nil {
		return nil, err
	}
	if len(s.handlers) > 0 {
		for i := range s.streams {
			st := &s.streams[i]
			if st.class == classSkip || st.class == classXRef {
				continue // images are never text; xref streams are not encrypted
			}
			if err := s.decryptStream(st, b, &inf); err != nil {
				return nil, err
			}
		}
	}
	for i := range s.streams {
		if st := &s.streams[i]; st.class == classXRef {
			st.vars, st.alt = nil, nil
		}
	}
	return s, b.check()
}

// filterKeys returns the keys of a stream dictionary that say how its data
// is encoded.
func filterKeys(hdr dict) dict {
	fk := dict{}
	for _, k := range []pdfName{"Filter", "F", "DecodeParms", "DP"} {
		if v, ok := hdr[k]; ok {
			fk[k] = v
		}
	}
	return fk
}

// resolveRefs replaces the references in v by the objects they name, a
// few levels deep.
func resolveRefs(v any, x *objIndex, depth int) any {
	if depth > 3 {
		return v
	}
	switch v := v.(type) {
	case objref:
		return resolveRefs(x.deref(v), x, depth+1)
	case array:
		out := make(array, len(v))
		for i, e := range v {
			out[i] = resolveRefs(e, x, depth+1)
		}
		return out
	case dict:
		out := make(dict, len(v))
		for k, e := range v {
			out[k] = resolveRefs(e, x, depth+1)
		}
		return out
	}
	return v
}

// decodeChains decodes raw with each chain.
func decodeChains(raw []byte, chains [][]filter, b *budget, inf *inflaters) ([]variant, error) {
	vars := make([]variant, 0, len(chains))
	for _, c := range chains {
		v, err := lenientChain(raw, c, b, inf)
		if err != nil {
			return nil, err
		}
		vars = append(vars, v)
	}
	return vars, nil
}

func allImages(vars []variant) bool {
	for _, v := range vars {
		if v.result != imageData {
			return false
		}
	}
	return len(vars) > 0
}

// decryptStream decodes st from its plaintext under every key that opens
// the file: those decodings become st.vars, the decodings of the
// ciphertext st.alt (read for their text, not costed).
func (s *scan) decryptStream(st *rawStream, b *budget, inf *inflaters) error {
	raw := s.data[st.start:st.end]
	var vars []variant
	applied := false
	for _, h := range s.handlers {
		// The default crypt filter, and one a chain names itself
		// (/Filter [/Crypt …] /DecodeParms [<< /Name … >>]).
		names := []pdfName{""}
		for _, c := range st.chains {
			if len(c) > 0 && c[0].name == "Crypt" {
				if p, ok := c[0].parms.(dict); ok {
					if n, ok := p["Name"].(pdfName); ok && n != "Identity" {
						names = append(names, n)
					}
				}
			}
		}
		for i, name := range names {
			if i > 0 && slicesIndex(names[:i], name) >= 0 {
				continue
			}
			if h.method(name) == cryptNone {
				continue
			}
			applied = true
			if st.obj < 0 {
				st.undecryptable = true
				continue
			}
			plain, ok, err := h.decrypt(raw, st.obj, st.gen, name, b)
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			vs, err := decodeChains(plain, st.chains, b, inf)
			if err != nil {
				return err
			}
			vars = append(vars, vs...)
		}
	}
	if !applied {
		return nil // the stream is stored in the clear (an Identity crypt filter)
	}
	st.alt, st.vars = st.vars, vars
	return nil
}

func slicesIndex(s []pdfName, n pdfName) int {
	for i, x := range s {
		if x == n {
			return i
		}
	}
	return -1
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

// objNumBefore reads the "N G obj" before position k: N and G, or -1, -1.
func objNumBefore(data []byte, k int) (int, int) {
	j := k
	for j > 0 && isSpace(data[j-1]) {
		j--
	}
	if j < 3 || string(data[j-3:j]) != "obj" {
		return -1, -1
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
			return -1, -1
		}
		v, _ := number(data[j:e])
		nums[n] = int(v)
	}
	return nums[0], nums[1]
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

// fallback costs the file from the scan alone: the text operators of
// every decoded stream, and what it could not decode: the estimate of
// budget.reserve for a stream no filter of this package reads, the size of
// every stream of a file the empty password does not open.
func (s *scan) fallback(b *budget, out *textOut) (Result, error) {
	var res Result
	names := scanNames(s.data)
	for _, st := range s.streams {
		if st.class == classObjects {
			for _, v := range append(st.vars, st.alt...) {
				if v.result != undecoded {
					names.add(scanNames(v.data))
				}
			}
		}
	}
	var inf inflaters
	fonts := &scanFonts{dec: s.cmaps(b)}
	for i := range s.streams {
		st := &s.streams[i]
		dressed := false
		if st.class == classSkip && st.obj >= 0 && names.contents[st.obj] {
			// A page's content dressed as an image, a font or metadata:
			// a reader that renders the page reads it as content.
			vars, err := decodeChains(s.data[st.start:st.end], st.chains, b, &inf)
			if err != nil {
				return res, err
			}
			st.class, st.vars, dressed = classText, vars, true
			if len(s.handlers) > 0 {
				if err := s.decryptStream(st, b, &inf); err != nil {
					return res, err
				}
			}
		}
		if st.class != classText {
			continue
		}
		for _, v := range append(st.vars, st.alt...) {
			if v.result != decoded && v.result != damaged {
				continue
			}
			if err := newInterp(b, out, fonts, 0).run(v.data); err != nil {
				return res, err
			}
			out.separate('\n')
		}
		size := int64(st.end - st.start)
		switch {
		case s.locked():
			// Probably ciphertext no reader opens without the password:
			// its size counts, and any text it shows (the file may only
			// claim to be encrypted) too.
			res.Unread += size
		case st.undecryptable && len(st.vars) == 0:
			est, err := b.reserve(int(size))
			if err != nil {
				return res, err
			}
			res.Unread += est
		default:
			for _, v := range st.vars {
				n := 0
				switch v.result {
				case damaged:
					res.Unread += size
					n = v.rest
				case undecoded:
					n = v.rest
				case imageData:
					if !dressed {
						n = v.rest
					}
				}
				est, err := b.reserve(n)
				if err != nil {
					return res, err
				}
				res.Unread += est
			}
		}
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

// maxScanCMaps bounds the ToUnicode CMaps the scan reads strings with.
const maxScanCMaps = 8
