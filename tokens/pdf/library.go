package pdf

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"

	lib "github.com/ledongthuc/pdf"
)

// Reading a file with the library, once check.go has passed it.

// boundPanic is thrown from inside the library's calls (by the ReaderAt the
// library reads through) when the deadline has passed; guard catches it.
type boundPanic struct{}

func (boundPanic) Error() string { return "pdf: deadline passed" }

// view is the io.ReaderAt the library reads the file through. Every read
// checks the deadline: the library reads the file for every object it
// resolves (it keeps no cache), so no loop of its can outlast the deadline
// by more than one object.
type view struct {
	data  []byte
	b     *budget
	patch bool // show the header as %PDF-1.7, a version the library accepts
}

var errNegative = errors.New("pdf: negative offset")

func (v *view) ReadAt(p []byte, off int64) (int, error) {
	if v.b.check() != nil {
		panic(boundPanic{})
	}
	if off < 0 {
		return 0, errNegative
	}
	if off >= int64(len(v.data)) {
		return 0, io.EOF
	}
	n := copy(p, v.data[off:])
	if v.patch && off < 8 {
		const hdr = "%PDF-1.7"
		for i := int(off); i < 8 && i-int(off) < n; i++ {
			p[i-int(off)] = hdr[i]
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// guard runs a call into the library. A panic in it (the library reports
// malformed input by panicking) becomes errLibrary; the deadline's panic
// becomes errOver.
func guard(b *budget, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(boundPanic); ok || b.over {
				b.over = true
				err = errOver
				return
			}
			err = errLibrary
		}
	}()
	f()
	if b.over {
		return errOver
	}
	return nil
}

var errLibrary = errors.New("pdf: library failed")

// call is guard for the page phase: a failure of the library there marks
// the reading degraded.
func (l *libReader) call(f func()) error {
	err := guard(l.b, f)
	if errors.Is(err, errLibrary) {
		l.degraded = true
	}
	return err
}

// Structural bounds of the library path, all far above what real files use.
const (
	maxTreeDepth = 64   // page tree levels
	maxFormDepth = 8    // form XObjects inside form XObjects
	maxContents  = 4096 // content streams of one page
	maxDiffs     = 512  // entries of an encoding's /Differences
	maxFontCache = 4096 // decoders and forms remembered
)

type libReader struct {
	r        *lib.Reader
	b        *budget
	lim      Limits
	out      *textOut
	size     int64
	data     []byte                // the file as the library reads it
	inf      inflaters             // for the streams this package decodes
	fonts    map[string]decoder    // by font resource dictionary and name
	empty    map[string]bool       // forms that show no text
	active   map[string]bool       // forms being run
	cut      bool                  // the form depth bound was reached
	pageB    *budget               // what the current page's streams may decode to
	formData map[string]streamData // the current page's decoded forms
	// degraded: the library failed on some object after text was written;
	// the caller adds the scan's cost.
	degraded bool
	res      Result
}

type pageRef struct {
	res      lib.Value
	contents []lib.Value // the page's content streams
}

func newLibReader(b *budget, lim Limits, out *textOut) *libReader {
	return &libReader{b: b, lim: lim, out: out,
		fonts: map[string]decoder{}, empty: map[string]bool{}, active: map[string]bool{}}
}

// read writes the text of data's pages. ok is false when the library could
// not open the file or walk its page tree; nothing was written then, and
// the caller falls back to the scan. After it, l.res is the result, and
// l.degraded says whether the library failed on some object on the way:
// the caller then adds the scan's cost.
func (l *libReader) read(data []byte, patch bool) (ok bool, err error) {
	b, out := l.b, l.out
	l.size, l.data = int64(len(data)), data
	var openErr error
	err = guard(b, func() {
		l.r, openErr = lib.NewReader(&view{data: data, b: b, patch: patch}, int64(len(data)))
	})
	if b.over {
		return false, errOver
	}
	if err != nil || openErr != nil {
		return false, nil
	}
	var pages []pageRef
	var count int
	// The walk resolves every page's content streams before any text is
	// written: a file the library stumbles on there is the scan's.
	err = guard(b, func() { pages, count = l.walk() })
	if err != nil {
		if errors.Is(err, errOver) {
			return false, errOver
		}
		return false, nil
	}
	if count == 0 {
		return false, nil
	}
	l.res.Pages = count
	for _, p := range pages {
		if err := l.page(p); err != nil {
			return true, err
		}
		out.separate('\n')
	}
	return true, out.flush()
}

// walk collects the first MaxPages pages of the page tree, in order, and
// counts them all. Pages nodes are visited once each (a tree with a cycle,
// or a node under two parents, is read as a tree); /Parent is never
// followed: inherited resources are carried down.
func (l *libReader) walk() ([]pageRef, int) {
	root := l.r.Trailer().Key("Root").Key("Pages")
	if root.Kind() != lib.Dict {
		return nil, 0
	}
	type frame struct {
		kids lib.Value
		i    int
		res  lib.Value
	}
	var pages []pageRef
	count := 0
	visited := map[string]bool{}
	leaf := func(v lib.Value, res lib.Value) {
		count++
		if count > l.lim.MaxPages {
			return
		}
		if r := v.Key("Resources"); !r.IsNull() {
			res = r
		}
		p := pageRef{res: res}
		c := v.Key("Contents")
		switch c.Kind() {
		case lib.Stream:
			p.contents = append(p.contents, c)
		case lib.Array:
			for i := 0; i < c.Len() && i < maxContents; i++ {
				if s := c.Index(i); s.Kind() == lib.Stream {
					p.contents = append(p.contents, s)
				}
			}
		}
		pages = append(pages, p)
	}
	kids := root.Key("Kids")
	if kids.Kind() != lib.Array {
		leaf(root, lib.Value{})
		return pages, count
	}
	visited[root.String()] = true
	stack := []frame{{kids: kids, res: root.Key("Resources")}}
	for len(stack) > 0 {
		if l.b.tick() != nil {
			panic(boundPanic{})
		}
		top := &stack[len(stack)-1]
		if top.i >= top.kids.Len() {
			stack = stack[:len(stack)-1]
			continue
		}
		kid := top.kids.Index(top.i)
		top.i++
		if kid.Kind() != lib.Dict {
			// A kid the library reads as null (an object it cannot find):
			// a reader that rebuilds the xref might find a page there.
			l.degraded = true
			continue
		}
		kk := kid.Key("Kids")
		if kk.Kind() != lib.Array || kid.Key("Type").Name() == "Page" {
			leaf(kid, top.res)
			continue
		}
		key := kid.String()
		if visited[key] {
			continue
		}
		visited[key] = true
		if len(stack) >= maxTreeDepth {
			panic(errLibrary)
		}
		res := top.res
		if r := kid.Key("Resources"); !r.IsNull() {
			res = r
		}
		stack = append(stack, frame{kids: kk, res: res})
	}
	return pages, count
}

// page writes one page's text. The distinct streams a page decodes
// (contents, forms, CMaps) may together produce MaxDecompressed bytes: the
// scan has charged them once already, under the same bound.
func (l *libReader) page(p pageRef) error {
	l.pageB = &budget{deadline: l.b.deadline, left: l.lim.MaxDecompressed}
	l.formData = map[string]streamData{}
	// A page's content streams are one stream cut in pieces: tokens may
	// span them.
	var content []byte
	var alts [][]byte
	for i, s := range p.contents {
		data, err := l.streamBytes(s)
		if err != nil {
			return err
		}
		alts = append(alts, data.alts...)
		if i == 0 {
			content = data.main
			continue
		}
		content = append(content, '\n')
		content = append(content, data.main...)
	}
	res := &libResources{l: l, v: p.res}
	if err := newInterp(l.b, l.out, res, 0).run(content); err != nil {
		return err
	}
	for _, a := range alts {
		l.out.separate('\n')
		if err := newInterp(l.b, l.out, res, 0).run(a); err != nil {
			return err
		}
	}
	return nil
}

// streamData is a stream as the library path reads it: main, the data
// pdf.js decodes; alts, the data other readers decode from the same
// stream, when its dictionary lets them differ (/F or /DP beside /Filter
// and /DecodeParms): read as separate content, so that one cannot hide the
// other.
type streamData struct {
	main []byte
	alts [][]byte
}

// streamBytes decodes a stream with this package's lenient chain
// (decode.go), never the library's reader: the data is where pdf.js takes
// it (/Length when `endstream` follows, else up to the next `endstream`),
// every filter pdf.js applies is applied, and the output is charged to the
// page's budget. What cannot be decoded (a filter this package does not
// know, the rest of a stream after damage) is priced by budget.reserve in
// Result.Unread, a damaged stream's size too: never its size alone.
func (l *libReader) streamBytes(s lib.Value) (streamData, error) {
	var off, length int64
	var hdr dict
	found := false
	err := l.call(func() {
		off, found = streamOffset(s)
		length = s.Key("Length").Int64()
		hdr = dict{}
		for _, k := range []string{"Filter", "F", "DecodeParms", "DP"} {
			if v := s.Key(k); v.Kind() != lib.Null {
				hdr[pdfName(k)] = mirror(v, 0)
			}
		}
	})
	if errors.Is(err, errOver) {
		return streamData{}, err
	}
	if err != nil || !found || off < 0 || off > int64(len(l.data)) {
		// The library could not read the stream's dictionary: the scan's
		// cost is added (l.call marked the reading degraded).
		l.degraded = true
		return streamData{}, nil
	}
	raw := l.data[off:streamExtent(l.data, int(off), length)]
	one := l.pageB
	if one == nil {
		one = &budget{deadline: l.b.deadline, left: l.lim.MaxDecompressed}
	}
	var sd streamData
	for i, chain := range streamChains(hdr, raw) {
		v, err := lenientChain(raw, chain, one, &l.inf)
		if one.over || errors.Is(err, errOver) {
			l.b.over = true
			return streamData{}, errOver
		}
		n := 0
		switch v.result {
		case damaged:
			l.res.Unread += int64(len(raw))
			n = v.rest
		case undecoded, imageData:
			n = v.rest
		}
		est, err := l.b.reserve(n)
		if err != nil {
			return streamData{}, err
		}
		l.res.Unread += est
		if i == 0 {
			sd.main = v.data
		} else if len(v.data) > 0 {
			sd.alts = append(sd.alts, v.data)
		}
	}
	return sd, nil
}

// streamOffset reads where a stream's data starts from the library's
// value (its String ends with "@offset").
func streamOffset(s lib.Value) (int64, bool) {
	if s.Kind() != lib.Stream {
		return 0, false
	}
	str := s.String()
	i := strings.LastIndexByte(str, '@')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(str[i+1:], 10, 64)
	return n, err == nil
}

// streamExtent returns where the data of a stream starting at start ends,
// as pdf.js finds it: after length bytes when the `endstream` keyword
// follows there (after white space and comments), else at the next
// `endstream` (pdf.js also takes the misspellings `endsteam` and `endstea`
// followed by white space), else at the end of the file.
func streamExtent(data []byte, start int, length int64) int {
	if length >= 0 && length <= int64(len(data)-start) {
		e := start + int(length)
		i := e
		for i < len(data) {
			if isSpace(data[i]) {
				i++
				continue
			}
			if data[i] == '%' {
				for i < len(data) && data[i] != '\r' && data[i] != '\n' {
					i++
				}
				continue
			}
			break
		}
		if rest := data[i:]; bytes.HasPrefix(rest, []byte("endstream")) &&
			(len(rest) == 9 || isSpace(rest[9]) || isDelim(rest[9])) {
			return e
		}
	}
	for i := start; i < len(data); {
		k := bytes.Index(data[i:], []byte("endst"))
		if k < 0 {
			break
		}
		p := i + k
		rest := data[p+3:]
		if bytes.HasPrefix(rest, []byte("stream")) {
			return p
		}
		for _, part := range []string{"steam", "stea"} {
			if bytes.HasPrefix(rest, []byte(part)) && len(rest) > len(part) && isSpace(rest[len(part)]) {
				return p
			}
		}
		i = p + 5
	}
	return len(data)
}

// mirror converts a library value to this package's object model (the
// few levels a filter chain has).
func mirror(v lib.Value, depth int) any {
	switch v.Kind() {
	case lib.Bool:
		return v.Bool()
	case lib.Integer:
		return v.Int64()
	case lib.Real:
		return v.Float64()
	case lib.String:
		return v.RawString()
	case lib.Name:
		return pdfName(v.Name())
	case lib.Array:
		if depth > 2 {
			return nil
		}
		n := min(v.Len(), maxChain+1)
		a := make(array, n)
		for i := range a {
			a[i] = mirror(v.Index(i), depth+1)
		}
		return a
	case lib.Dict:
		if depth > 2 {
			return nil
		}
		d := dict{}
		for _, k := range v.Keys() {
			if len(d) >= 64 {
				break
			}
			d[pdfName(k)] = mirror(v.Key(k), depth+1)
		}
		return d
	}
	return nil
}
